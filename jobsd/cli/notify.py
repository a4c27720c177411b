"""``jobsd notify``: the enqueue NOTIFY switch."""

from __future__ import annotations

import click

from jobsd.cli.common import load_settings, require_url, run_async
from jobsd.cli.errors import friendly_errors

__all__ = ["notify"]


@click.command()
@click.argument("switch", type=click.Choice(["on", "off", "status"]))
@friendly_errors
def notify(switch: str) -> None:
    """Turn the enqueue NOTIFY on or off (off: daemons find work by polling only)."""
    from jobsd.store import admin
    from jobsd.store.db import AsyncConn

    url = require_url(load_settings())

    async def apply(conn: AsyncConn) -> bool:
        if switch != "status":
            await admin.set_notify(conn, switch == "on")
        return await admin.notify_enabled(conn)

    enabled = run_async(url, "notify switch", apply, command="notify")
    click.echo(f"notifications {'on' if enabled else 'off'}")
