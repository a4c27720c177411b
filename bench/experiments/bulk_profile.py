"""Scratch: cProfile of ``Client.enqueue_many`` (1,000 jobs per call), to see where the
client's CPU of a bulk enqueue goes.

    JOBSD_ALLOW_INSECURE=1 JOBSD_REQUIRE_SCRAM=0 \
        uv run python bench/experiments/bulk_profile.py [--database-url URL] [--calls 50]

Prints the top functions by total and by cumulative time (spec building included).
"""

from __future__ import annotations

import cProfile
import pstats

from common import run_on_scratch

import jobsd
from jobsd.client import JobSpec
from jobsd.settings import Settings

B = 1000


async def main_async(url: str, calls: int) -> None:
    async with jobsd.Client(url, settings=Settings(database_url=url, pool_size=2)) as client:
        for _ in range(3):
            await client.enqueue_many(
                [JobSpec.build("noop", {"i": i}, org_id="bench") for i in range(B)]
            )
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            await client.enqueue_many(
                [JobSpec.build("noop", {"i": i}, org_id="bench") for i in range(B)]
            )
        prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    run_on_scratch("bulkprof", main_async, calls=50)
