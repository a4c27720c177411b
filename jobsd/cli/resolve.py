"""``jobsd resolve``: settle a recovery_required job."""

from __future__ import annotations

import click

from jobsd.cli.common import on_job, token_option
from jobsd.cli.errors import fail, friendly_errors

__all__ = ["resolve"]


@click.command()
@click.argument("job_id")
@click.option("--succeeded", "how", flag_value="succeeded", help="The work was done.")
@click.option("--failed", "how", flag_value="failed", help="The work was not done.")
@click.option("--requeue", "how", flag_value="requeue", help="Run the job again.")
@token_option
@friendly_errors
def resolve(job_id: str, how: str | None, token: str | None) -> None:
    """Settle a recovery_required job (its outcome was unknown); recorded in its history."""
    from jobsd.ops.resolve import resolve_job

    if how is None:
        fail("say how: --succeeded, --failed or --requeue")
    written = on_job(
        job_id,
        token,
        "resolve",
        lambda conn, caller, key: resolve_job(conn, caller, key, how),
        command="resolve",
    )
    click.echo(f"job {written.id} {written.status}")
