"""Scratch: ``enqueue_many`` through ``jobs_insert_many`` against the same batches through
``COPY``, interleaved; wall time, client and backend CPU per job, by batch size.

    JOBSD_ALLOW_INSECURE=1 JOBSD_REQUIRE_SCRAM=0 \
        uv run python bench/experiments/bulk_copy.py [--database-url URL] [--calls 20] \
        [--sizes 10,50,100,1000]

The way is chosen by setting ``jobsd.store.enqueue.BULK_COPY_MIN_JOBS`` before a call:
above the batch's size it inserts, at 1 it copies.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import anyio
from common import DEFAULT_URL, median, pids_cpu, scratch

import jobsd
from jobsd.jobspec import JobSpec
from jobsd.settings import Settings
from jobsd.store import enqueue as store_enqueue

WAYS = {"insert": 10**9, "copy": 1}


async def main_async(url: str, calls: int, sizes: list[int]) -> None:
    async with jobsd.Client(url, settings=Settings(database_url=url, pool_size=2)) as client:
        await client._open()
        async with client._pool.connection() as c1, client._pool.connection() as c2:
            backends = (c1.info.backend_pid, c2.info.backend_pid)

        async def call(way: str, size: int, lo: int) -> None:
            store_enqueue.BULK_COPY_MIN_JOBS = WAYS[way]
            specs = [JobSpec.build("noop", {"i": i}, org_id="bench") for i in range(lo, lo + size)]
            await client.enqueue_many(specs)

        cpu: dict[tuple[str, int], list[float]] = defaultdict(list)
        pg: dict[tuple[str, int], list[float]] = defaultdict(list)
        wall: dict[tuple[str, int], list[float]] = defaultdict(list)
        lo = 0
        for size in sizes:
            rounds = max(3, calls * 1000 // size // 10)
            for way in WAYS:
                await call(way, size, lo)
                lo += size
            for _ in range(rounds):
                for way in WAYS:
                    b0 = pids_cpu(*backends)
                    t = time.process_time()
                    w = time.perf_counter()
                    await call(way, size, lo)
                    key = (way, size)
                    wall[key].append((time.perf_counter() - w) / size * 1e6)
                    cpu[key].append((time.process_time() - t) / size * 1e6)
                    pg[key].append((pids_cpu(*backends) - b0) / size * 1e6)
                    lo += size
    print("| jobs per call | way | µs wall/job | µs client CPU/job | µs backend CPU/job |")
    print("|---|---|---|---|---|")
    for size in sizes:
        for way in WAYS:
            key = (way, size)
            print(
                f"| {size} | {way} | {median(wall[key]):.1f} | {median(cpu[key]):.1f} "
                f"| {median(pg[key]):.1f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--sizes", default="10,50,100,1000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with scratch(args.database_url) as s:
        anyio.run(main_async, s.clone("bulk_copy"), args.calls, sizes)


if __name__ == "__main__":
    main()
