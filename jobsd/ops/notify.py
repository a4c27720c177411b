"""The enqueue NOTIFY switch (off: daemons find work by polling only): an operator's."""

from __future__ import annotations

from jobsd.ops.authority import Act, require
from jobsd.ops.caller import Caller
from jobsd.store import admin as store
from jobsd.store.db import AsyncConn

__all__ = ["switch_notify"]


async def switch_notify(conn: AsyncConn, caller: Caller, on: bool | None) -> bool:
    """Turn the NOTIFY on or off (None: leave it); return whether it is on. Forbidden
    unless an operator."""
    require(caller, Act.ADMINISTER_QUEUES)
    if on is not None:
        await store.set_notify(conn, on)
    return await store.notify_enabled(conn)
