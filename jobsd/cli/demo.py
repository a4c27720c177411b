"""``jobsd demo crash``: the crash demo on the dev database (``jobsd.dev.crash_demo``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from jobsd.cli.errors import fail, friendly_errors

__all__ = ["demo"]


@click.group()
def demo() -> None:
    """Demonstrations that run against a real database."""


@demo.command()
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the published artifacts and the daemons' logs go (default: a temp dir).",
)
@friendly_errors
def crash(workspace: Path | None) -> None:
    """A job publishes, its daemon dies hard (after_publish, then after_outcome_sent),
    a new daemon recovers it: show the job, its history and the artifact, once.

    Uses JOBSD_DATABASE_URL, else a throwaway embedded Postgres (as `jobsd dev`).
    """
    from jobsd.cli.common import check_url, migrate
    from jobsd.dev.crash_demo import run_demo
    from jobsd.dev.database import dev_database
    from jobsd.settings import Settings

    with dev_database(Settings().database_url) as (url, embedded):
        check_url(url)
        migrate(url)
        where = Path(workspace or tempfile.mkdtemp(prefix="jobsd-crash-demo-"))
        click.echo(f"workspace: {where}")
        runs = run_demo(url, where, insecure=embedded, say=click.echo)
    broken = [r for r in runs if r.job.status != "succeeded" or r.artifacts != 1]
    click.echo(
        f"\n{len(runs) - len(broken)} of {len(runs)} jobs recovered with their side effect once"
    )
    if broken:
        fail("some jobs did not recover as expected: see above and the workspace's logs")
