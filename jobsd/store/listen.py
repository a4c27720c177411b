"""Dedicated LISTEN connections: connect with back-off, LISTEN, yield payloads.

Shared by the daemon's listener (new jobs) and the API's waiter (finished jobs). The
connection comes from ``store.connect`` (TLS policy, keepalives: a LISTEN connection
idles for hours, and a dead peer must be noticed).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from psycopg import sql

from jobsd.store.connect import open_connection_async
from jobsd.store.db import AsyncConn, db_errors
from jobsd.store.retries import transient_retries

__all__ = ["channel_notifications", "notifications", "open_listen_connection"]


async def open_listen_connection(
    url: str, *channels: str, application_name: str, operation: str
) -> AsyncConn:
    """Connect and LISTEN on ``channels``, retrying with back-off while the database is
    away."""
    async for attempt in transient_retries(operation):
        with attempt:
            conn = await open_connection_async(
                url, application_name=application_name, operation=operation
            )
            try:
                with db_errors(operation):
                    for channel in channels:
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            except BaseException:
                await conn.close()
                raise
            return conn
    raise AssertionError("unreachable: transient_retries never stops")


async def notifications(
    conn: AsyncConn,
    operation: str,
    *,
    timeout_s: float | None = None,
    stop_after: int | None = None,
) -> AsyncIterator[str]:
    """Yield notification payloads until the connection fails (BackendUnavailable).

    ``timeout_s`` ends the iteration after that long, ``stop_after`` after that many
    payloads (or a few more, when they arrived together); None is never.
    """
    async for _, payload in channel_notifications(
        conn, operation, timeout_s=timeout_s, stop_after=stop_after
    ):
        yield payload


async def channel_notifications(
    conn: AsyncConn,
    operation: str,
    *,
    timeout_s: float | None = None,
    stop_after: int | None = None,
) -> AsyncIterator[tuple[str, str]]:
    """``notifications``, as (channel, payload), for a connection on several channels."""
    with db_errors(operation):
        async for note in conn.notifies(timeout=timeout_s, stop_after=stop_after):
            yield note.channel, note.payload
