"""pgqueuer in the side-by-side cases on psycopg 3, the driver jobsd uses.

The same calls as ``libs.pgqueuer_lib`` (its asyncpg twin), through pgqueuer's
``PsycopgDriver`` on an autocommit ``psycopg.AsyncConnection``, as its documentation
shows for psycopg: reading the two side by side separates what is the driver's from
what is the library's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import psycopg
from pgqueuer.db import PsycopgDriver

from libs import Setting
from libs.pgqueuer_lib import (
    OPEN_JOBS_SQL,
    SETTINGS,
    Producer,
    install_on,
    producer_on,
    serve_on,
)

__all__ = ["OPEN_JOBS_SQL", "SETTINGS", "install", "producer", "serve"]


@asynccontextmanager
async def _connection(url: str) -> AsyncIterator[psycopg.AsyncConnection]:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        yield conn
    finally:
        await conn.close()


async def install(url: str) -> None:
    """Install pgqueuer's tables, types, triggers and functions."""
    await install_on(_connection, PsycopgDriver, url)


def producer(url: str) -> AbstractAsyncContextManager[Producer]:
    return producer_on(_connection, PsycopgDriver, url)


def serve(url: str, setting: Setting, on_start: Callable[[int], None]) -> None:
    """Run a PgQueuer worker until SIGTERM."""
    serve_on(_connection, PsycopgDriver, url, setting, on_start)
