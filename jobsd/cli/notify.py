"""``jobsd notify``: the enqueue NOTIFY switch."""

from __future__ import annotations

import click

from jobsd.cli.common import load_settings, operator, require_url, run_async
from jobsd.cli.errors import friendly_errors

__all__ = ["notify"]


@click.command()
@click.argument("switch", type=click.Choice(["on", "off", "status"]))
@friendly_errors
def notify(switch: str) -> None:
    """Turn the enqueue NOTIFY on or off (off: daemons find work by polling only)."""
    from jobsd.ops.notify import switch_notify

    url = require_url(load_settings())
    on = None if switch == "status" else switch == "on"
    enabled = run_async(
        url, "notify switch", lambda conn: switch_notify(conn, operator(), on), command="notify"
    )
    click.echo(f"notifications {'on' if enabled else 'off'}")
