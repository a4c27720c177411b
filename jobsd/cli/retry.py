"""``jobsd retry``: a failed or cancelled job runs again, as a new job."""

from __future__ import annotations

import click

from jobsd.cli.common import on_job, token_option
from jobsd.cli.errors import friendly_errors

__all__ = ["retry"]


@click.command()
@click.argument("job_id")
@click.option(
    "--force",
    is_flag=True,
    help="Retry a job of an at_most_once type too (its last run may have had effects).",
)
@token_option
@friendly_errors
def retry(job_id: str, force: bool, token: str | None) -> None:
    """Retry a failed or cancelled job: a new job, queued, with the same type, queue,
    payload and priority.

    The failed or cancelled job stays as it ended; its history says which job retries
    it. The new job is admitted like any enqueue (a full queue refuses it). Asking
    again prints the same new job.
    """
    from jobsd.ops.retry import retry_job

    retried = on_job(
        job_id,
        token,
        "retry",
        lambda conn, caller, key: retry_job(conn, caller, key, force=force),
        command="retry",
    )
    parsed = retried.job.retry_of
    again = "" if retried.created else " (retried before)"
    click.echo(f"job {parsed} retried as job {retried.job.id}, {retried.job.status}{again}")
