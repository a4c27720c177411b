"""Scratch: where the daemon's Python CPU goes per drained job (cProfile).

    uv run --group bench python bench/experiments/daemon_profile.py [--database-url URL]
        [--jobs 20000] [--slots 100]

Enqueues ``--jobs`` no-op jobs, then runs one daemon in this process under cProfile
until every outcome is written; prints the CPU per job, the statements per job
(bench/probe.py), the top functions by own time and the time by package.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections import defaultdict

import anyio
from common import DEFAULT_URL, scratch
from daemon_cases import bench_registry, running_daemon, settled
from measure import client_for, enqueue_bulk
from probe import Probe

from jobsd.settings import Settings


def _family(filename: str) -> str:
    for key in (
        "psycopg_pool",
        "psycopg",
        "jobsd/worker",
        "jobsd/store",
        "jobsd",
        "anyio",
        "asyncio",
        "json",
        "tenacity",
        "logging",
        "uuid",
        "selectors",
    ):
        if f"/{key}" in filename or filename.startswith(key):
            return key
    if filename.startswith("~") or filename == "~":
        return "builtins (C)"
    return "other"


async def main_async(url: str, jobs: int, slots: int) -> None:
    async with client_for(url) as client:
        await enqueue_bulk(client, jobs, 1000)
    wrote = anyio.Event()
    probe = Probe(on_call=lambda: wrote.set())
    settings = Settings(database_url=url, slots=slots, handlers=[])
    prof = cProfile.Profile()
    with probe.installed():
        t0, c0 = time.perf_counter(), time.process_time()
        prof.enable()
        async with running_daemon(settings, bench_registry()) as daemon:
            while settled(daemon) < jobs:
                await wrote.wait()
                wrote = anyio.Event()
        prof.disable()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"{jobs} jobs, {slots} slots: {jobs / wall:,.0f} jobs/s, "
        f"{cpu / jobs * 1e6:.0f} µs Python CPU/job (under cProfile)"
    )
    for name, s in sorted(probe.stats.items()):
        if s.calls:
            print(
                f"  {name}: {s.calls} calls, {s.rows / s.calls:.1f} rows/call, "
                f"{s.calls / jobs:.3f}/job, {s.seconds / s.calls * 1000:.2f} ms/call"
            )
    stats = pstats.Stats(prof)
    by_family: dict[str, float] = defaultdict(float)
    total = 0.0
    for (filename, _line, _fn), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        by_family[_family(filename)] += tt
        total += tt
    print("\nown time by package (share of profiled time):")
    for fam, tt in sorted(by_family.items(), key=lambda kv: -kv[1]):
        print(f"  {fam}: {tt / total:.0%} ({tt / jobs * 1e6:.1f} µs/job)")
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats("jobsd", 30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--slots", type=int, default=100)
    args = parser.parse_args()
    with scratch(args.database_url) as s:
        url = s.clone("daemon")
        anyio.run(main_async, url, args.jobs, args.slots)


if __name__ == "__main__":
    main()
