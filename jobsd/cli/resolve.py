"""``jobsd resolve``: settle a recovery_required job."""

from __future__ import annotations

import click

from jobsd.cli.common import load_settings, require_url, run_async
from jobsd.cli.errors import fail, friendly_errors
from jobsd.models import Job

__all__ = ["resolve"]


@click.command()
@click.argument("job_id")
@click.option("--succeeded", "outcome", flag_value="succeeded", help="The work was done.")
@click.option("--failed", "outcome", flag_value="failed", help="The work was not done.")
@click.option("--requeue", "outcome", flag_value="queued", help="Run the job again.")
@friendly_errors
def resolve(job_id: str, outcome: str | None) -> None:
    """Settle a recovery_required job (its outcome was unknown); recorded in its history."""
    import uuid

    from jobsd.store import queries
    from jobsd.store.db import AsyncConn

    if outcome is None:
        fail("say how: --succeeded, --failed or --requeue")
    try:
        parsed = uuid.UUID(job_id)
    except ValueError:
        fail(f"{job_id!r} is not a job id (a UUID)")
    url = require_url(load_settings())

    async def apply(conn: AsyncConn) -> tuple[Job | None, Job | None]:
        written = await queries.resolve_job(
            conn,
            parsed,
            status=outcome,
            reason="resolved by operator",
            actor="cli",
            error="resolved as failed by an operator" if outcome == "failed" else None,
        )
        return written, await queries.get_job(conn, parsed)

    written, job = run_async(url, f"resolve of job {parsed}", apply, command="resolve")
    if job is None:
        fail(f"job {parsed} not found")
    if written is None:
        fail(f"job {parsed} is {job.status}, not recovery_required: nothing to resolve")
    click.echo(f"job {parsed} {written.status}")
