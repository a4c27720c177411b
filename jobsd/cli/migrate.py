"""``jobsd migrate``: apply pending schema migrations, or print them as one SQL script."""

from __future__ import annotations

import click

from jobsd.cli.common import load_settings, require_url
from jobsd.cli.errors import friendly_errors

__all__ = ["migrate"]


@click.command()
@click.option("--database-url", envvar="JOBSD_DATABASE_URL", help="libpq URL of the database.")
@click.option(
    "--sql",
    "as_sql",
    is_flag=True,
    help="Print the migrations as one SQL script for another migration tool or psql "
    "(run it in one transaction) instead of applying them; connects to no database.",
)
@click.option(
    "--after",
    type=click.IntRange(min=0),
    metavar="VERSION",
    help="With --sql: only the migrations after VERSION, for a database migrated up to it.",
)
@friendly_errors
def migrate(database_url: str | None, as_sql: bool, after: int | None) -> None:
    """Apply pending schema migrations (safe to repeat and to run concurrently), or with
    --sql print them as one SQL script."""
    from jobsd.cli.common import migrate, migration_script

    if after is not None and not as_sql:
        raise click.UsageError("--after goes with --sql")
    if as_sql:
        click.echo(migration_script(after), nl=False)
        return
    settings = load_settings(database_url=database_url)
    applied = migrate(require_url(settings))
    if applied:
        for name in applied:
            click.echo(f"applied {name}")
    else:
        click.echo("schema up to date")
