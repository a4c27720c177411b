"""The ``jobsd`` command: run the daemon, migrate, enqueue and inspect jobs.

Errors are one line on stderr (``jobsd: error: ...``) and a non-zero exit, never a
traceback.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import datetime
from typing import Any

import click

from jobsd.cli_errors import fail, friendly_errors, quiet_libraries
from jobsd.errors import BackendUnavailable, ConfigError
from jobsd.models import Job, JobEvent
from jobsd.settings import Settings

__all__ = ["main"]


EXIT_JOB_FAILED = 3


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment, with command-line overrides."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def _require_url(settings: Settings) -> str:
    if not settings.database_url:
        raise ConfigError("no database configured: set JOBSD_DATABASE_URL (or use `jobsd dev`)")
    return settings.database_url


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobsd")
def main() -> None:
    """jobsd: a Postgres-backed job queue."""
    quiet_libraries()


@main.command()
@click.option("--database-url", envvar="JOBSD_DATABASE_URL", help="libpq URL of the database.")
@friendly_errors
def migrate(database_url: str | None) -> None:
    """Apply pending schema migrations (safe to repeat and to run concurrently)."""
    from jobsd.store.migrate import migrate_sync

    settings = load_settings(database_url=database_url)
    applied = migrate_sync(_require_url(settings))
    if applied:
        for name in applied:
            click.echo(f"applied {name}")
    else:
        click.echo("schema up to date")


@main.command()
@click.option("--slots", type=int, help="Jobs run at once (JOBSD_SLOTS).")
@friendly_errors
def run(slots: int | None) -> None:
    """Run the worker daemon until SIGTERM or SIGINT."""
    from jobsd.logs import setup_logging
    from jobsd.security import require_secure_connection
    from jobsd.worker.supervisor import run_daemon

    settings = load_settings(slots=slots)
    url = _require_url(settings)
    setup_logging(settings.log_level, settings.log_format)
    require_secure_connection(url)
    _check_schema(url)
    run_daemon(settings)


def _check_schema(url: str) -> None:
    """Refuse to start on a database whose schema is behind; tolerate one that is down."""

    from jobsd.errors import MigrationError
    from jobsd.store.migrate import migration_status_sync

    try:
        pending = [m.name for m in migration_status_sync(url) if not m.applied]
    except BackendUnavailable as exc:
        logging.getLogger("jobsd.cli").warning("daemon.schema_unchecked", extra={"error": str(exc)})
        return
    if pending:
        raise MigrationError(
            f"database schema is behind ({', '.join(pending)} pending): run `jobsd migrate`"
        )
    from jobsd.roles import check_sees_all_orgs

    try:
        check_sees_all_orgs(url)  # a role limited to one org would idle without a word
    except BackendUnavailable as exc:
        logging.getLogger("jobsd.cli").warning("daemon.role_unchecked", extra={"error": str(exc)})


@main.command()
@click.option("--slots", type=int, default=None, help="Jobs run at once.")
@friendly_errors
def dev(slots: int | None) -> None:
    """Run jobsd for real on a throwaway embedded Postgres, with the example handlers."""
    from jobsd.dev import run_dev

    run_dev(slots=slots)


@main.command()
@click.argument("type")
@click.option("--org", "org_id", required=True, help="Organisation the job belongs to.")
@click.option("--payload", default="{}", show_default=True, help="Job arguments, a JSON object.")
@click.option("--queue", default="default", show_default=True)
@click.option("--dedup-key", default=None, help="At most one such job per org is pending.")
@click.option("--run-after", type=click.DateTime(), default=None, help="Not before (UTC).")
@click.option("--id", "job_id", default=None, help="Client job id (UUID): makes retries safe.")
@click.option(
    "--priority",
    type=click.IntRange(-1_000_000, 1_000_000),
    default=0,
    show_default=True,
    help="Lower runs first.",
)
@click.option(
    "--concurrency-key", default=None, help="Jobs sharing a key run at most its limit at once."
)
@click.option(
    "--depends-on",
    multiple=True,
    metavar="JOB_ID",
    help="A job that must succeed first (repeatable).",
)
@click.option("--wait", is_flag=True, help="Follow the job to its end; exit 3 unless it succeeded.")
@friendly_errors
def enqueue(
    type: str,
    org_id: str,
    payload: str,
    queue: str,
    dedup_key: str | None,
    run_after: datetime | None,
    job_id: str | None,
    priority: int,
    concurrency_key: str | None,
    depends_on: tuple[str, ...],
    wait: bool,
) -> None:
    """Enqueue a job and print its id alone on stdout."""
    from datetime import UTC

    from jobsd.client import SyncClient

    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        fail(f"--payload is not valid JSON: {exc}")
    if run_after is not None and run_after.tzinfo is None:
        run_after = run_after.replace(tzinfo=UTC)
    settings = load_settings()
    _require_url(settings)
    with SyncClient(settings=settings) as client:
        try:
            job = client.enqueue(
                type,
                data,
                org_id=org_id,
                queue=queue,
                dedup_key=dedup_key,
                run_after=run_after,
                job_id=job_id,
                priority=priority,
                concurrency_key=concurrency_key,
                depends_on=depends_on,
            )
        except ValueError as exc:  # bad arguments, e.g. a job depending on itself
            fail(str(exc))
        click.echo(str(job.id))
        if wait:
            final = _follow(client, job)
            if final.status != "succeeded":
                detail = f": {final.error}" if final.error else ""
                fail(f"job {final.id} {final.status}{detail}", EXIT_JOB_FAILED)


def _follow(client: Any, job: Job) -> Job:
    """Poll a job until it is terminal, drawing a progress bar on a terminal."""
    tty = sys.stderr.isatty()
    last_line = ""
    while not job.status.terminal:
        time.sleep(0.25)
        job = client.get(job.id)
        line = _progress_line(job)
        if line != last_line:
            if tty:
                click.echo("\r\x1b[2K" + line, err=True, nl=False)
            else:
                click.echo(line, err=True)
            last_line = line
    if tty:
        click.echo("", err=True)
    return job


def _progress_line(job: Job) -> str:
    progress = job.progress or {}
    done, total = progress.get("done"), progress.get("total")
    if isinstance(done, int) and isinstance(total, int) and total > 0:
        width = 30
        filled = min(width, width * done // total)
        bar = "#" * filled + "-" * (width - filled)
        return f"{job.status} [{bar}] {done}/{total}"
    if isinstance(done, int):
        return f"{job.status} {done} done"
    return str(job.status)


@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the job and its history as JSON.")
@friendly_errors
def status(job_id: str, as_json: bool) -> None:
    """Show a job's state, progress, report, error and history."""
    import uuid

    from jobsd.client import SyncClient

    try:
        uuid.UUID(job_id)
    except ValueError:
        fail(f"{job_id!r} is not a job id (a UUID)")
    settings = load_settings()
    _require_url(settings)
    with SyncClient(settings=settings) as client:
        job = client.get(job_id)
        events = client.events(job_id)
    if as_json:
        click.echo(
            json.dumps({**job.to_json(), "history": [e.to_json() for e in events]}, indent=2)
        )
        return
    _print_job(job, events)


@main.command()
@click.argument("job_id")
@friendly_errors
def cancel(job_id: str) -> None:
    """Cancel a job: at once when it has not started, by request when it is running."""
    import uuid

    import anyio
    import psycopg

    from jobsd.store import queries
    from jobsd.store.db import db_errors

    try:
        parsed = uuid.UUID(job_id)
    except ValueError:
        fail(f"{job_id!r} is not a job id (a UUID)")
    url = _require_url(load_settings())

    async def apply() -> queries.CancelOutcome:
        with db_errors(f"cancel of job {parsed}"):
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                return await queries.cancel_job(
                    conn, parsed, actor="cli", reason="cancelled by operator"
                )

    done = anyio.run(apply)
    if done.job is None:
        fail(f"job {parsed} not found")
    match done.action:
        case "cancelled":
            click.echo(f"job {parsed} cancelled")
        case "requested":
            click.echo(
                f"job {parsed} is running: cancel requested (its handler stops within a heartbeat)"
            )
        case _:
            if done.job.status == "cancelled":
                click.echo(f"job {parsed} cancelled")
            elif done.job.status == "running":
                click.echo(f"job {parsed} is running: cancel already requested")
            else:
                fail(f"job {parsed} is {done.job.status}: nothing to cancel")


@main.command()
@click.argument("job_id")
@click.option("--succeeded", "outcome", flag_value="succeeded", help="The work was done.")
@click.option("--failed", "outcome", flag_value="failed", help="The work was not done.")
@click.option("--requeue", "outcome", flag_value="queued", help="Run the job again.")
@friendly_errors
def resolve(job_id: str, outcome: str | None) -> None:
    """Settle a recovery_required job (its outcome was unknown); recorded in its history."""
    import uuid

    import anyio
    import psycopg

    from jobsd.store import queries
    from jobsd.store.db import db_errors

    if outcome is None:
        fail("say how: --succeeded, --failed or --requeue")
    try:
        parsed = uuid.UUID(job_id)
    except ValueError:
        fail(f"{job_id!r} is not a job id (a UUID)")
    url = _require_url(load_settings())

    async def apply() -> tuple[Job | None, Job | None]:
        with db_errors(f"resolve of job {parsed}"):
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                written = await queries.resolve_job(
                    conn,
                    parsed,
                    status=outcome,
                    reason="resolved by operator",
                    actor="cli",
                    error="resolved as failed by an operator" if outcome == "failed" else None,
                )
                return written, await queries.get_job(conn, parsed)

    written, job = anyio.run(apply)
    if job is None:
        fail(f"job {parsed} not found")
    if written is None:
        fail(f"job {parsed} is {job.status}, not recovery_required: nothing to resolve")
    click.echo(f"job {parsed} {written.status}")


def _print_job(job: Job, events: list[JobEvent]) -> None:
    fields = [
        ("id", str(job.id)),
        ("type", job.type),
        ("org", job.org_id),
        ("queue", job.queue),
        ("status", str(job.status) + (f" ({job.reason})" if job.reason else "")),
        ("attempts", str(job.attempts)),
        ("created", _when(job.created_at)),
        ("started", _when(job.started_at)),
        ("finished", _when(job.finished_at)),
    ]
    if job.dedup_key:
        fields.append(("dedup key", job.dedup_key))
    if job.priority:
        fields.append(("priority", str(job.priority)))
    if job.concurrency_key:
        fields.append(("key", job.concurrency_key))
    if job.progress:
        fields.append(("progress", json.dumps(job.progress)))
    if job.error:
        fields.append(("error", job.error))
    if job.report:
        fields.append(("report", json.dumps(job.report)[:2000]))
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        click.echo(f"{key:<{width}}  {value}")
    click.echo("history")
    for e in events:
        move = f"{e.from_status or '-'} -> {e.to_status}"
        extra = " ".join(
            part
            for part in (
                f"attempt={e.attempt}",
                f"worker={e.worker_id}" if e.worker_id else "",
                f"reason={e.reason!r}" if e.reason else "",
            )
            if part
        )
        click.echo(f"  {_when(e.at)}  {move:<24} {extra}")


def _when(value: datetime | None) -> str:
    return value.isoformat(timespec="milliseconds") if value else "-"


@main.command()
@click.argument("switch", type=click.Choice(["on", "off", "status"]))
@friendly_errors
def notify(switch: str) -> None:
    """Turn the enqueue NOTIFY on or off (off: daemons find work by polling only)."""
    import anyio
    import psycopg

    from jobsd.store import queries
    from jobsd.store.db import db_errors

    url = _require_url(load_settings())

    async def apply() -> bool:
        with db_errors("notify switch"):
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                if switch != "status":
                    await queries.set_notify(conn, switch == "on")
                return await queries.notify_enabled(conn)

    enabled = anyio.run(apply)
    click.echo(f"notifications {'on' if enabled else 'off'}")


def _register_extensions() -> None:
    from jobsd import export_cli, http_cli, queue_cli, retention_cli, roles_cli

    export_cli.register(main)
    http_cli.register(main)
    queue_cli.register(main)
    retention_cli.register(main)
    roles_cli.register(main)


_register_extensions()
