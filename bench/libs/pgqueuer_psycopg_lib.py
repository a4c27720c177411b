"""pgqueuer in the side-by-side cases on psycopg 3, the driver jobsd uses.

The same calls as ``libs.pgqueuer_lib`` (its asyncpg twin), through pgqueuer's
``PsycopgDriver`` on an autocommit ``psycopg.AsyncConnection``, as its documentation
shows for psycopg: reading the two side by side separates what is the driver's from
what is the library's.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import psycopg
from pgqueuer import PgQueuer, Queries
from pgqueuer.db import PsycopgDriver
from pgqueuer.models import Job

from libs import Setting
from libs.pgqueuer_lib import ENTRYPOINT, OPEN_JOBS_SQL, SETTINGS

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
    async with _connection(url) as conn:
        await Queries(PsycopgDriver(conn)).install()


class Producer:
    def __init__(self, queries: Queries) -> None:
        self.queries = queries

    async def enqueue_one(self, i: int) -> None:
        await self.queries.enqueue(ENTRYPOINT, str(i).encode())

    async def enqueue_many(self, numbers: Sequence[int]) -> None:
        n = len(numbers)
        await self.queries.enqueue([ENTRYPOINT] * n, [str(i).encode() for i in numbers], [0] * n)


@asynccontextmanager
async def producer(url: str) -> AsyncIterator[Producer]:
    async with _connection(url) as conn:
        yield Producer(Queries(PsycopgDriver(conn)))


def serve(url: str, setting: Setting, on_start: Callable[[int], None]) -> None:
    """Run a PgQueuer worker until SIGTERM."""

    async def main() -> None:
        async with _connection(url) as conn:
            pgq = PgQueuer(PsycopgDriver(conn))

            @pgq.entrypoint(ENTRYPOINT)
            async def noop(job: Job) -> None:
                on_start(int(job.payload or b"0"))

            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, pgq.shutdown.set)
            await pgq.run(**setting.options)

    asyncio.run(main())
