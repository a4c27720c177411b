"""jobsd in the side-by-side cases: Client.enqueue / enqueue_batch, the daemon in a child.

The child runs ``run_daemon`` (what ``jobsd run`` runs after its schema check) with the
bench handler registered in the default registry; SIGTERM stops it gracefully.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from measure import ORG, TYPE, client_for

import jobsd
from jobsd.models import OPEN_STATES
from jobsd.settings import Settings
from libs import Setting

SETTINGS = {
    "default": Setting("10 slots (JOBSD_SLOTS default)", {"slots": 10}),
    "best": Setting("100 slots", {"slots": 100}),
}
OPEN_JOBS_SQL = "SELECT EXISTS (SELECT 1 FROM jobsd.jobs WHERE status IN ({}))".format(
    ", ".join(f"'{s}'" for s in OPEN_STATES)
)


async def install(url: str) -> None:
    """Nothing: jobsd's cases run in a clone of the migrated template."""


class Producer:
    """A jobsd Client (sequential calls use one of its pool's connections)."""

    def __init__(self, client: jobsd.Client) -> None:
        self.client = client

    async def enqueue_one(self, i: int) -> None:
        await self.client.enqueue(TYPE, {"i": i}, org_id=ORG)

    async def enqueue_many(self, numbers: Sequence[int]) -> None:
        await self.client.enqueue_batch(TYPE, [{"i": i} for i in numbers], org_id=ORG)


@asynccontextmanager
async def producer(url: str) -> AsyncIterator[Producer]:
    async with client_for(url) as client:
        yield Producer(client)


def serve(url: str, setting: Setting, on_start: Callable[[int], None]) -> None:
    """Run a daemon until SIGTERM, calling ``on_start`` first in each job."""
    from jobsd.worker.supervisor import run_daemon

    @jobsd.handler(TYPE)
    async def noop(ctx: jobsd.JobContext) -> None:
        on_start(ctx.payload["i"])

    run_daemon(Settings(database_url=url, handlers=[], **setting.options))
