"""``jobsd dev``: jobsd for real on a throwaway Postgres, with the example handlers."""

from __future__ import annotations

import click

from jobsd.cli.errors import friendly_errors

__all__ = ["dev"]


@click.command()
@click.option("--slots", type=int, default=None, help="Jobs run at once.")
@click.option(
    "--examples/--no-examples",
    default=True,
    show_default=True,
    help="Enqueue example jobs (org demo) now and then, for the dashboard to show.",
)
@friendly_errors
def dev(slots: int | None, examples: bool) -> None:
    """Run jobsd for real on a throwaway embedded Postgres, with the example handlers."""
    from jobsd.dev.devserver import run_dev

    run_dev(slots=slots, examples=examples)
