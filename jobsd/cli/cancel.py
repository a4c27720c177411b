"""``jobsd cancel``: cancel a job."""

from __future__ import annotations

import click

from jobsd.cli.common import load_settings, require_url, run_async
from jobsd.cli.errors import fail, friendly_errors

__all__ = ["cancel"]


@click.command()
@click.argument("job_id")
@friendly_errors
def cancel(job_id: str) -> None:
    """Cancel a job: at once when it has not started, by request when it is running."""
    import uuid

    from jobsd.store import queries

    try:
        parsed = uuid.UUID(job_id)
    except ValueError:
        fail(f"{job_id!r} is not a job id (a UUID)")
    url = require_url(load_settings())

    done = run_async(
        url,
        f"cancel of job {parsed}",
        lambda conn: queries.cancel_job(conn, parsed, actor="cli", reason="cancelled by operator"),
        command="cancel",
    )
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
