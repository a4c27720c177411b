"""Dedicated connections: connect with back-off, LISTEN, yield payloads.

Shared by the daemon's listener (new jobs) and the API's waiter (finished jobs); the
daemon's lifeline holds one too (``store.workers``). A dedicated connection is
long-lived and idle most of the time, so TCP keepalives are on: a dead peer is
noticed in about a minute instead of never.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg import sql

from jobsd.store.db import db_errors, transient_retries

__all__ = [
    "ListenConnection",
    "notifications",
    "open_dedicated_connection",
    "open_listen_connection",
]

ListenConnection = psycopg.AsyncConnection[Any]

_KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


async def open_dedicated_connection(
    url: str, *, application_name: str, operation: str
) -> psycopg.AsyncConnection[Any]:
    """Connect (autocommit, keepalives on), retrying with back-off while the database is away."""
    async for attempt in transient_retries(operation):
        with attempt, db_errors(operation):
            return await _connect(url, application_name)
    raise AssertionError("unreachable: transient_retries never stops")


async def open_listen_connection(
    url: str, channel: str, *, application_name: str, operation: str
) -> psycopg.AsyncConnection[Any]:
    """Connect and LISTEN on ``channel``, retrying with back-off while the database is away."""
    async for attempt in transient_retries(operation):
        with attempt, db_errors(operation):
            conn = await _connect(url, application_name)
            try:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            except BaseException:
                await conn.close()
                raise
            return conn
    raise AssertionError("unreachable: transient_retries never stops")


async def _connect(url: str, application_name: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(
        url, autocommit=True, application_name=application_name, **_KEEPALIVES
    )


async def notifications(
    conn: psycopg.AsyncConnection[Any],
    operation: str,
    *,
    timeout_s: float | None = None,
    stop_after: int | None = None,
) -> AsyncIterator[str]:
    """Yield notification payloads until the connection fails (BackendUnavailable).

    ``timeout_s`` ends the iteration after that long, ``stop_after`` after that many
    payloads (or a few more, when they arrived together); None is never.
    """
    with db_errors(operation):
        async for note in conn.notifies(timeout=timeout_s, stop_after=stop_after):
            yield note.payload
