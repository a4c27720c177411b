"""``jobsd enqueue``: create a job, optionally follow it to its end."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Unpack

import click

from jobsd.cli.common import Moment, load_settings, require_url
from jobsd.cli.errors import fail, friendly_errors
from jobsd.jobspec import EnqueueOptions
from jobsd.models import Job

__all__ = ["EXIT_JOB_FAILED", "enqueue"]

EXIT_JOB_FAILED = 3


@click.command()
@click.argument("type")
@click.option(
    "--org",
    "org_id",
    default=None,
    help="Organisation the job belongs to (default: JOBSD_DEFAULT_ORG).",
)
@click.option("--payload", default="{}", show_default=True, help="Job arguments, a JSON object.")
@click.option("--queue", default="default", show_default=True)
@click.option("--dedup-key", default=None, help="At most one such job per org is pending.")
@click.option(
    "--run-after",
    type=Moment(),
    default=None,
    help="Not before: ISO 8601 (UTC without an offset), or a delay such as 10m.",
)
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
    type: str, org_id: str | None, payload: str, wait: bool, **options: Unpack[EnqueueOptions]
) -> None:
    """Enqueue a job and print its id alone on stdout.

    Without --org the job goes to JOBSD_DEFAULT_ORG's org; with neither, nothing is
    enqueued.
    """
    from datetime import UTC

    from jobsd.client import SyncClient

    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        fail(f"--payload is not valid JSON: {exc}")
    except RecursionError:
        fail("--payload is nested too deeply")
    run_after = options.get("run_after")
    if run_after is not None and run_after.tzinfo is None:
        options["run_after"] = run_after.replace(tzinfo=UTC)
    settings = load_settings()
    require_url(settings)
    if org_id is None and not settings.default_org:
        fail("no org given: use --org, or set JOBSD_DEFAULT_ORG")
    with SyncClient(settings=settings) as client:
        try:
            job = client.enqueue(type, data, org_id=org_id, **options)
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
