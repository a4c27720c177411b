"""procrastinate in the side-by-side cases: App on a PsycopgConnector.

Setup as its documentation says: ``app.schema_manager.apply_schema_async()`` (what
``procrastinate schema --apply`` runs) in an empty database; ``Task.defer_async`` for one
job and ``Task.batch_defer_async`` for a batch; the worker is ``App.run_worker_async``,
which stops gracefully on SIGTERM.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import procrastinate

from libs import Setting

SETTINGS = {
    # Worker(concurrency=1) is its default; its docs suggest concurrency for async tasks
    "default": Setting("concurrency 1 (its default)", {"concurrency": 1}),
    "best": Setting("concurrency 100", {"concurrency": 100}),
}
OPEN_JOBS_SQL = "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"


def _app(url: str, **pool: Any) -> tuple[procrastinate.App, Any]:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url, **pool))

    @app.task(name="noop")
    async def noop(i: int) -> None:
        pass

    return app, noop


async def install(url: str) -> None:
    """Apply procrastinate's schema."""
    app, _ = _app(url)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


class Producer:
    def __init__(self, task: Any) -> None:
        self.task = task

    async def enqueue_one(self, i: int) -> None:
        await self.task.defer_async(i=i)

    async def enqueue_many(self, numbers: Sequence[int]) -> None:
        await self.task.batch_defer_async(*({"i": i} for i in numbers))


@asynccontextmanager
async def producer(url: str) -> AsyncIterator[Producer]:
    app, task = _app(url, min_size=1, max_size=1)  # one producer connection
    async with app.open_async():
        yield Producer(task)


def serve(url: str, setting: Setting, on_start: Callable[[int], None]) -> None:
    """Run a procrastinate worker until SIGTERM."""
    import asyncio

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    async def noop(i: int) -> None:
        on_start(i)

    async def main() -> None:
        async with app.open_async():
            await app.run_worker_async(**setting.options)

    asyncio.run(main())
