"""``jobsd jobs list``: jobs newest first, filtered by state, type, queue, org and time."""

from __future__ import annotations

import json
from datetime import datetime

import click

from jobsd.cli.common import Moment, load_settings, replica_line, run_lagging, token_option
from jobsd.cli.errors import fail, friendly_errors
from jobsd.models import Job, JobStatus

__all__ = ["jobs"]

# rows fetched per round trip; the listing itself has no limit unless --limit
_PAGE = 500


@click.group()
def jobs() -> None:
    """Look at jobs: list them (one job in detail: `jobsd status ID`)."""


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
    from jobsd.ops import AsyncConn, Caller
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
