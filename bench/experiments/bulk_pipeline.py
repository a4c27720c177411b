"""Scratch: one bulk statement against chunks of it pipelined in one transaction.

    JOBSD_ALLOW_INSECURE=1 uv run python bench/experiments/bulk_pipeline.py [--database-url URL]

``jobs_insert_many`` of 1,000 jobs as one autocommit statement, and as chunks sent in
psycopg's pipeline mode inside one transaction (the client encodes chunk k+1 while the
server inserts chunk k: on two cores the two overlap). Specs are built before each
call, as the side-by-side bench does. Wall time per job, interleaved rounds, medians.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import anyio
import psycopg
from common import DEFAULT_URL, median, scratch
from psycopg.rows import tuple_row

from jobsd.jobspec import JobSpec
from jobsd.store.enqueue import _many_params
from jobsd.store.sqlfiles import load_queries

B = 1000


async def main_async(url: str, calls: int) -> None:
    text = load_queries()["jobs_insert_many"]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:

        async def one(specs: list[JobSpec]) -> int:
            async with conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(text, _many_params(specs), prepare=True)
                return len(await cur.fetchall())

        def chunked(size: int):  # type: ignore[no-untyped-def]
            async def run(specs: list[JobSpec]) -> int:
                cursors = []
                async with conn.pipeline(), conn.transaction():
                    for lo in range(0, len(specs), size):
                        cur = conn.cursor(row_factory=tuple_row)
                        await cur.execute(text, _many_params(specs[lo : lo + size]), prepare=True)
                        cursors.append(cur)
                n = 0
                for cur in cursors:
                    n += len(await cur.fetchall())
                return n

            return run

        variants = {"one statement": one} | {
            f"pipelined, {B // k} x {k}": chunked(k) for k in (500, 250, 125)
        }
        wall: dict[str, list[float]] = defaultdict(list)
        lo = 0
        for _ in range(calls):
            for name, fn in variants.items():
                specs = [JobSpec.build("noop", {"i": i}, org_id="bench") for i in range(lo, lo + B)]
                lo += B
                t = time.perf_counter()
                assert await fn(specs) == B
                wall[name].append((time.perf_counter() - t) / B * 1e6)
    print("| 1,000 jobs per call | µs wall per job (median) | jobs/s |\n|---|---|---|")
    for name, xs in wall.items():
        print(f"| {name} | {median(xs):.1f} | {1e6 / median(xs):,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--calls", type=int, default=15)
    args = parser.parse_args()
    with scratch(args.database_url) as s:
        anyio.run(main_async, s.clone("pipe"), args.calls)


if __name__ == "__main__":
    main()
