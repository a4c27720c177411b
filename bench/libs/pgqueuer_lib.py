"""pgqueuer in the side-by-side cases, on asyncpg as its quick start shows.

Setup as its documentation says: ``Queries(AsyncpgDriver(conn)).install()`` (what
``pgq install`` runs) in an empty database; ``Queries.enqueue`` with scalars for one job
and with lists for a batch (one statement); a ``PgQueuer`` worker with one
``entrypoint``, run with ``run(batch_size=...)``. (Its psycopg driver is much slower
here: it waits for notifications with a 1 s timeout on the connection it also queries
on; bench/README.md has the figures.)
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import asyncpg
from pgqueuer import PgQueuer, Queries
from pgqueuer.db import AsyncpgDriver, Driver
from pgqueuer.models import Job

from libs import Setting

ENTRYPOINT = "noop"
SETTINGS = {
    # QueueManager.run / `pgq run`: batch_size=10, no cap on concurrent tasks
    "default": Setting("batch size 10, tasks uncapped (its defaults)", {"batch_size": 10}),
    "best": Setting("batch size 50, tasks uncapped", {"batch_size": 50}),
}
OPEN_JOBS_SQL = "SELECT EXISTS (SELECT 1 FROM pgqueuer)"  # finished jobs move to pgqueuer_log


@asynccontextmanager
async def _connection(url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


# A pgqueuer driver around an open connection (AsyncpgDriver, PsycopgDriver), and the
# connection it takes, opened and closed around a use.
DriverOf = Callable[[Any], Driver]
ConnectionOf = Callable[[str], AbstractAsyncContextManager[Any]]


async def install(url: str) -> None:
    """Install pgqueuer's tables, types, triggers and functions."""
    await install_on(_connection, AsyncpgDriver, url)


async def install_on(connection: ConnectionOf, driver: DriverOf, url: str) -> None:
    """``install`` on another driver."""
    async with connection(url) as conn:
        await Queries(driver(conn)).install()


class Producer:
    def __init__(self, queries: Queries) -> None:
        self.queries = queries

    async def enqueue_one(self, i: int) -> None:
        await self.queries.enqueue(ENTRYPOINT, str(i).encode())

    async def enqueue_many(self, numbers: Sequence[int]) -> None:
        n = len(numbers)
        await self.queries.enqueue([ENTRYPOINT] * n, [str(i).encode() for i in numbers], [0] * n)


def producer(url: str) -> AbstractAsyncContextManager[Producer]:
    return producer_on(_connection, AsyncpgDriver, url)


@asynccontextmanager
async def producer_on(
    connection: ConnectionOf, driver: DriverOf, url: str
) -> AsyncIterator[Producer]:
    """``producer`` on another driver."""
    async with connection(url) as conn:
        yield Producer(Queries(driver(conn)))


def serve(url: str, setting: Setting, on_start: Callable[[int], None]) -> None:
    """Run a PgQueuer worker until SIGTERM."""
    serve_on(_connection, AsyncpgDriver, url, setting, on_start)


def serve_on(
    connection: ConnectionOf,
    driver: DriverOf,
    url: str,
    setting: Setting,
    on_start: Callable[[int], None],
) -> None:
    """Run a PgQueuer worker on ``driver`` over ``connection(url)`` until SIGTERM."""

    async def main() -> None:
        async with connection(url) as conn:
            pgq = PgQueuer(driver(conn))

            @pgq.entrypoint(ENTRYPOINT)
            async def noop(job: Job) -> None:
                on_start(int(job.payload or b"0"))

            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, pgq.shutdown.set)
            await pgq.run(**setting.options)

    asyncio.run(main())
