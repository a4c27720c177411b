"""``jobsd notify``: the enqueue NOTIFY switch."""

from __future__ import annotations

import click

from jobsd.cli.common import load_settings, require_url
from jobsd.cli.errors import friendly_errors

__all__ = ["notify"]


@click.command()
@click.argument("switch", type=click.Choice(["on", "off", "status"]))
@friendly_errors
def notify(switch: str) -> None:
    """Turn the enqueue NOTIFY on or off (off: daemons find work by polling only)."""
    import anyio
    import psycopg

    from jobsd.store import queries
    from jobsd.store.db import db_errors

    url = require_url(load_settings())

    async def apply() -> bool:
        with db_errors("notify switch"):
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                if switch != "status":
                    await queries.set_notify(conn, switch == "on")
                return await queries.notify_enabled(conn)

    enabled = anyio.run(apply)
    click.echo(f"notifications {'on' if enabled else 'off'}")
