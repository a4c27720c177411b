"""``jobsd retry``: a new attempt of a failed or cancelled job."""

from __future__ import annotations

import click

from jobsd.cli.common import load_settings, require_url
from jobsd.cli.errors import fail, friendly_errors

__all__ = ["retry"]


@click.command()
@click.argument("job_id")
@click.option(
    "--force",
    is_flag=True,
    help="Retry a job of an at_most_once type too (its last run may have had effects).",
)
@friendly_errors
def retry(job_id: str, force: bool) -> None:
    """Put a failed or cancelled job back in the queue for a new attempt.

    The move is recorded in the job's history (reason 'retry', actor cli:USER);
    attempts keep counting. A job that has not ended is left alone.
    """
    import getpass
    import uuid

    from jobsd.client import SyncClient

    try:
        parsed = uuid.UUID(job_id)
    except ValueError:
        fail(f"{job_id!r} is not a job id (a UUID)")
    settings = load_settings()
    require_url(settings)
    with SyncClient(settings=settings) as client:
        job = client.retry(parsed, force=force, actor=f"cli:{getpass.getuser()}")
    click.echo(f"job {job.id} queued again (attempt {job.attempts + 1} next)")
