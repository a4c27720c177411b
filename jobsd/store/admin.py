"""One typed function per named statement of ``sql/queries/admin.sql``: the NOTIFY switch.

(``admin_set_actor``, the other statement of the file, runs inside the functions that
change a job's status on someone's behalf: ``store.queries``.)
"""

from __future__ import annotations

from jobsd.store.db import AsyncConn, db_errors
from jobsd.store.named import run_named, sql_text

__all__ = ["notify_enabled", "set_notify"]


async def set_notify(conn: AsyncConn, enabled: bool) -> None:
    """Enable or disable the NOTIFY triggers (poll-only mode when disabled)."""
    name = "admin_notify_enable" if enabled else "admin_notify_disable"
    with db_errors("switching notifications"):
        await conn.execute(sql_text(name))  # two statements: no parameters, simple protocol


async def notify_enabled(conn: AsyncConn) -> bool:
    """Say whether the NOTIFY triggers are enabled."""
    with db_errors("reading the notification switch"):
        rows = await run_named(conn, "admin_notify_status", {})
    return bool(rows and rows[0]["enabled"])
