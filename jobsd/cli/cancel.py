"""``jobsd cancel``: cancel a job."""

from __future__ import annotations

import click

from jobsd.cli.common import on_job, token_option
from jobsd.cli.errors import friendly_errors

__all__ = ["cancel"]


@click.command()
@click.argument("job_id")
@token_option
@friendly_errors
def cancel(job_id: str, token: str | None) -> None:
    """Cancel a job: at once when it has not started, by request when it is running."""
    from jobsd.ops.cancel import cancel_job

    done = on_job(
        job_id,
        token,
        "cancel",
        lambda conn, caller, key: cancel_job(conn, caller, key, reason="cancelled by operator"),
        command="cancel",
    )
    parsed = done.job.id
    if done.action == "cancelled":
        click.echo(f"job {parsed} cancelled")
    elif done.changed:
        click.echo(f"job {parsed} is running: cancel requested (its handler stops at once)")
    else:
        click.echo(f"job {parsed} is running: cancel already requested")
