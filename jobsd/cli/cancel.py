"""``jobsd cancel``: cancel a job."""

from __future__ import annotations

import click

from jobsd.cli.common import load_settings, require_url
from jobsd.cli.errors import fail, friendly_errors

__all__ = ["cancel"]


@click.command()
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
    url = require_url(load_settings())

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
