"""``jobsd migrate``: apply pending schema migrations."""

from __future__ import annotations

import click

from jobsd.cli.common import load_settings, require_url
from jobsd.cli.errors import friendly_errors

__all__ = ["migrate"]


@click.command()
@click.option("--database-url", envvar="JOBSD_DATABASE_URL", help="libpq URL of the database.")
@friendly_errors
def migrate(database_url: str | None) -> None:
    """Apply pending schema migrations (safe to repeat and to run concurrently)."""
    from jobsd.cli.common import migrate

    settings = load_settings(database_url=database_url)
    applied = migrate(require_url(settings))
    if applied:
        for name in applied:
            click.echo(f"applied {name}")
    else:
        click.echo("schema up to date")
