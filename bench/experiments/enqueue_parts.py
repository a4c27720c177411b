"""Scratch: the client's CPU per enqueue, whole and in parts, and libpq against psycopg.

    uv run --group bench python bench/experiments/enqueue_parts.py [--database-url URL]

Process CPU per call (median of ten interleaved rounds) of ``Client.enqueue`` on
jobsd's pool, the spec alone, a pool checkout alone, the same enqueue with the insert
forced through psycopg's cursor, the sync client both ways, and a ``SELECT 1`` round
trip through psycopg (the floor of any statement on it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from common import run_on_scratch
from measure import ORG, TYPE

import jobsd
from jobsd.client import JobSpec
from jobsd.store import enqueue as store_enqueue
from jobsd.store.db import acquire
from jobsd.store.named import run_named, run_named_sync

ROUNDS = 10


def _through_psycopg(
    through_psycopg: bool,
) -> tuple[Callable[..., Awaitable[Any]], Callable[..., Any]]:
    """The executors of the own-pool path, or psycopg's plain ones."""
    if through_psycopg:
        return run_named, run_named_sync
    return store_enqueue._run_on_own_pool, store_enqueue._run_on_own_pool_sync


async def _rounds(
    variants: dict[str, Callable[[int], Awaitable[None]]], n: int
) -> dict[str, float]:
    """Median process CPU per call of each variant, over interleaved rounds."""
    for fn in variants.values():
        for i in range(50):
            await fn(-i)
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(ROUNDS):
        for name, fn in variants.items():
            t = time.process_time()
            for i in range(n // ROUNDS):
                await fn(i)
            samples[name].append((time.process_time() - t) / (n // ROUNDS) * 1e6)
    return {name: statistics.median(xs) for name, xs in samples.items()}


async def main_async(url: str, n: int) -> None:
    wire_async, wire_sync = _through_psycopg(False)
    plain_async, plain_sync = _through_psycopg(True)
    figures: dict[str, float] = {}
    # one client open at a time: a pool's background work counts in the process's CPU
    async with jobsd.Client(url) as client:
        pool = client._pool

        async def whole(i: int) -> None:
            await client.enqueue(TYPE, {"i": i}, org_id=ORG)

        async def whole_psycopg(i: int) -> None:
            store_enqueue._run_on_own_pool = plain_async  # type: ignore[assignment]
            try:
                await client.enqueue(TYPE, {"i": i}, org_id=ORG)
            finally:
                store_enqueue._run_on_own_pool = wire_async  # type: ignore[assignment]

        async def spec(i: int) -> None:
            JobSpec.build(TYPE, {"i": i}, org_id=ORG)

        async def checkout(i: int) -> None:
            async with acquire(pool, "checkout"):
                pass

        async def select1(i: int) -> None:
            async with acquire(pool, "select 1") as conn:
                await conn.execute("SELECT 1")

        figures |= await _rounds(
            {
                "Client.enqueue (insert on libpq)": whole,
                "Client.enqueue, insert through psycopg": whole_psycopg,
                "JobSpec.build": spec,
                "pool checkout and return": checkout,
                "SELECT 1 through psycopg": select1,
            },
            n,
        )
    with jobsd.SyncClient(url) as sync_client:

        async def sync_whole(i: int) -> None:
            sync_client.enqueue(TYPE, {"i": i}, org_id=ORG)

        async def sync_psycopg(i: int) -> None:
            store_enqueue._run_on_own_pool_sync = plain_sync  # type: ignore[assignment]
            try:
                sync_client.enqueue(TYPE, {"i": i}, org_id=ORG)
            finally:
                store_enqueue._run_on_own_pool_sync = wire_sync  # type: ignore[assignment]

        figures |= await _rounds(
            {
                "SyncClient.enqueue (insert on libpq)": sync_whole,
                "SyncClient.enqueue, insert through psycopg": sync_psycopg,
            },
            n,
        )
    print("| part | µs process CPU per call |\n|---|---|")
    for name, us in figures.items():
        print(f"| {name} | {us:.0f} |")


if __name__ == "__main__":
    run_on_scratch("parts", main_async, n=3000)
