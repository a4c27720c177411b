"""``jobsd jobs``: list jobs newest first, filtered by state, type, queue, org and time;
and retry, cancel or resolve every job of such a filter in one call (the bulk actions,
``jobsd.ops.bulk``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from jobsd.cli.common import (
    Moment,
    load_settings,
    replica_line,
    require_url,
    run_as,
    run_lagging,
    token_option,
)
from jobsd.cli.errors import fail, friendly_errors
from jobsd.models import Job, JobStatus

if TYPE_CHECKING:
    from jobsd.ops import AsyncConn, Caller
    from jobsd.ops.bulk import BulkOptions, BulkOutcome

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["jobs"]

# rows fetched per round trip; the listing itself has no limit unless --limit
_PAGE = 500


@click.group()
def jobs() -> None:
    """Look at jobs: list them (one job in detail: `jobsd status ID`); retry, cancel or
    resolve every job of a filter at once."""


@jobs.command("list")
@click.option(
    "--status",
    type=click.Choice([s.value for s in JobStatus]),
    default=None,
    help="Only jobs in this state.",
)
@click.option("--type", "type_", default=None, metavar="T", help="Only jobs of this type.")
@click.option("--queue", default=None, metavar="Q", help="Only jobs of this queue.")
@click.option("--org", "org_id", default=None, metavar="O", help="Only jobs of this org.")
@click.option(
    "--since",
    type=Moment(ago=True),
    default=None,
    metavar="D",
    help="Only jobs created since D: ISO 8601 (2030-01-01, 2030-01-01T00:00:00Z) or a "
    "duration ago (30m, 2h, 3d).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Jobs shown at most.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per job.")
@token_option
@friendly_errors
def jobs_list(
    status: str | None,
    type_: str | None,
    queue: str | None,
    org_id: str | None,
    since: datetime | None,
    limit: int,
    as_json: bool,
    token: str | None,
) -> None:
    """List jobs, newest first (every org's unless --org; a token's org only).

    With JOBSD_READ_DATABASE_URL the list is read on that replica while it answers,
    and a line on stderr says so, with its delay.
    """
    from jobsd.ops.listing import Cursor, list_jobs

    if org_id is not None and not org_id:
        fail("--org must not be empty")
    settings = load_settings()

    async def pages(conn: AsyncConn, caller: Caller) -> list[Job]:
        found: list[Job] = []
        after: Cursor | None = None
        while len(found) < limit:
            page = await list_jobs(
                conn,
                caller,
                status=status,
                type=type_,
                queue=queue,
                org_id=org_id,
                since=since,
                after=after,
                limit=min(_PAGE, limit - len(found)),
            )
            found += page.jobs
            if page.next is None:
                break
            after = page.next
        return found

    served = run_lagging(settings, token, "listing of jobs", pages, command="jobs")
    found = served.value
    line = replica_line(served.replica, served.lag_s)
    if line is not None:  # on stderr: the listing itself stays as scripts read it
        click.echo(f"jobsd: {line}", err=True)
    if as_json:
        for job in found:
            click.echo(json.dumps(_listed(job)))
        return
    rows = [["ID", "TYPE", "QUEUE", "ORG", "STATUS", "ATTEMPTS", "CREATED"]]
    rows += [
        [
            str(j.id),
            j.type,
            j.queue,
            j.org_id,
            str(j.status),
            str(j.attempts),
            j.created_at.isoformat(timespec="seconds"),
        ]
        for j in found
    ]
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _listed(job: Job) -> dict[str, object]:
    """The job as ``jobsd status --json`` shows it, without payload, report and history."""
    data = job.to_json()
    for key in ("payload", "report"):
        data.pop(key, None)
    return data


# -- bulk actions: every job of a filter retried, cancelled or resolved in one call --

_BULK_LIMIT = 1000  # jobsd.ops.bulk.DEFAULT_LIMIT (not imported: the command starts fast)
_BULK_MAX = 10_000  # jobsd.ops.bulk.MAX_LIMIT


def _bulk_options(states: list[str], default: str | None) -> Callable[[F], F]:
    """Declare the filter and the switches every bulk command shares."""

    def declare(func: F) -> F:
        what = f"(default: {default})" if default else "(default: every one of them)"
        options = [
            click.option(
                "--status",
                type=click.Choice(states),
                default=default,
                help=f"Only jobs in this state {what}.",
            ),
            click.option(
                "--type", "type_", default=None, metavar="T", help="Only jobs of this type."
            ),
            click.option("--queue", default=None, metavar="Q", help="Only jobs of this queue."),
            click.option(
                "--org",
                "org_id",
                default=None,
                metavar="O",
                help="Only jobs of this org (an operator's choice: a token acts on its own org).",
            ),
            click.option(
                "--since",
                type=Moment(ago=True),
                default=None,
                metavar="D",
                help="Only jobs created since D: ISO 8601 or a duration ago (30m, 2h, 3d).",
            ),
            click.option(
                "--until",
                type=Moment(ago=True),
                default=None,
                metavar="D",
                help="Only jobs created before D: ISO 8601 or a duration ago.",
            ),
            click.option(
                "--limit",
                type=int,
                default=_BULK_LIMIT,
                show_default=True,
                help=f"Jobs taken at most, oldest first (1..{_BULK_MAX}); run the command "
                "again for the next ones.",
            ),
            click.option(
                "--dry-run", is_flag=True, help="Only count the jobs it would take; change nothing."
            ),
            click.option("--yes", "-y", is_flag=True, help="Do not ask for a confirmation."),
            click.option("--json", "as_json", is_flag=True, help="The summary as one JSON object."),
            token_option,
        ]
        for option in reversed(options):
            func = option(func)
        return func

    return declare


def _bulk(
    verb: str,
    run: Callable[[AsyncConn, Caller, bool], Awaitable[BulkOutcome]],
    *,
    yes: bool,
    dry_run: bool,
    as_json: bool,
    token: str | None,
) -> None:
    """Run a bulk action: count first and ask (unless ``yes``), then act; print the
    summary (or the count of a dry run)."""
    url = require_url(load_settings())
    operation = f"bulk {verb} of jobs"
    try:
        if dry_run or not yes:
            counted = run_as(
                url, token, operation, lambda c, who: run(c, who, True), command="jobs"
            )
            if dry_run:
                _show(counted, as_json)
                return
            if counted.matched == 0:
                if as_json:
                    _show(counted, as_json)
                else:
                    click.echo(f"no job matches: nothing to {verb}")
                return
            more = (
                f" (the oldest; {counted.remaining} match)"
                if counted.remaining > counted.matched
                else ""
            )
            click.confirm(f"{verb.capitalize()} {counted.matched} jobs{more}?", abort=True)
        outcome = run_as(url, token, operation, lambda c, who: run(c, who, False), command="jobs")
    except ValueError as exc:
        fail(str(exc))
    _show(outcome, as_json)


def _show(outcome: BulkOutcome, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(outcome.to_json()))
        return
    line = outcome.summary()
    if outcome.id is not None:
        line += f" (bulk action {outcome.id})"
    click.echo(line)


def _filters(
    status: str | None,
    type_: str | None,
    queue: str | None,
    org_id: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
) -> BulkOptions:
    if org_id is not None and not org_id:
        fail("--org must not be empty")
    return {
        "status": status,
        "type": type_,
        "queue": queue,
        "org_id": org_id,
        "since": since,
        "until": until,
        "limit": limit,
    }


def _dry(options: BulkOptions, dry_run: bool) -> BulkOptions:
    return {**options, "dry_run": dry_run}


@jobs.command("retry")
@_bulk_options(["failed", "cancelled"], "failed")
@click.option(
    "--force",
    is_flag=True,
    help="Retry jobs of at_most_once types too (their last run may have had effects).",
)
@friendly_errors
def jobs_retry(
    status: str | None,
    type_: str | None,
    queue: str | None,
    org_id: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    token: str | None,
    force: bool,
) -> None:
    """Retry every failed (or --status cancelled) job of the filter that was not retried
    yet, each as a new job, oldest first, at most --limit.

    Each new job is admitted like any enqueue: a full queue or an org's quota refuses
    it, and the summary counts the refusals by reason. Running the command again
    continues with the jobs still matching; it asks first unless --yes.
    """
    from jobsd.ops.bulk import retry_many

    options = _filters(status, type_, queue, org_id, since, until, limit)
    _bulk(
        "retry",
        lambda conn, caller, dry: retry_many(conn, caller, force=force, **_dry(options, dry)),
        yes=yes,
        dry_run=dry_run,
        as_json=as_json,
        token=token,
    )


@jobs.command("cancel")
@_bulk_options(["queued", "scheduled", "blocked", "running"], None)
@friendly_errors
def jobs_cancel(
    status: str | None,
    type_: str | None,
    queue: str | None,
    org_id: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    token: str | None,
) -> None:
    """Cancel every open job of the filter (queued, scheduled, blocked, running; or
    --status), oldest first, at most --limit.

    A running job gets a cancel request, as `jobsd cancel` gives it: its handler stops
    at once. It asks first unless --yes.
    """
    from jobsd.ops.bulk import cancel_many

    options = _filters(status, type_, queue, org_id, since, until, limit)
    _bulk(
        "cancel",
        lambda conn, caller, dry: cancel_many(
            conn, caller, reason="cancelled by operator (bulk)", **_dry(options, dry)
        ),
        yes=yes,
        dry_run=dry_run,
        as_json=as_json,
        token=token,
    )


@jobs.command("resolve")
@_bulk_options(["recovery_required"], "recovery_required")
@click.option(
    "--as",
    "as_",
    type=click.Choice(["succeeded", "failed", "requeue", "queued"]),
    default=None,
    help="How: succeeded (the work was done), failed (it was not), requeue or queued "
    "(run it again).",
)
@click.option("--succeeded", "flag", flag_value="succeeded", help="The work was done.")
@click.option("--failed", "flag", flag_value="failed", help="The work was not done.")
@click.option("--requeue", "flag", flag_value="requeue", help="Run the jobs again.")
@friendly_errors
def jobs_resolve(
    status: str | None,
    type_: str | None,
    queue: str | None,
    org_id: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    token: str | None,
    as_: str | None,
    flag: str | None,
) -> None:
    """Settle every recovery_required job of the filter (their outcome was unknown),
    oldest first, at most --limit: --as succeeded|failed|queued (or --succeeded,
    --failed, --requeue, as `jobsd resolve` says it).

    Recorded in each job's history. It asks first unless --yes.
    """
    from jobsd.ops.bulk import resolution_of, resolve_many

    if as_ is not None and flag is not None and resolution_of(as_) != resolution_of(flag):
        fail(f"--as {as_} and --{flag} disagree: say how once")
    how = as_ or flag
    if how is None:
        fail("say how: --as succeeded, --as failed or --as queued")
    options = _filters(status, type_, queue, org_id, since, until, limit)
    _bulk(
        "resolve",
        lambda conn, caller, dry: resolve_many(conn, caller, how, **_dry(options, dry)),
        yes=yes,
        dry_run=dry_run,
        as_json=as_json,
        token=token,
    )
