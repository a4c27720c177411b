"""Scratch: drain N no-op jobs with one in-process daemon, no profiler (for perf).

    uv run --group bench python bench/experiments/drain_perf.py URL [--jobs N] [--slots N]

Prints the rate and the daemon's CPU per job; run ``perf record`` on Postgres meanwhile
to see where the server's time goes.
"""

from __future__ import annotations

import argparse
import time

import anyio
import common  # noqa: F401  (puts bench/ on the path)
from daemon_cases import bench_registry, running_daemon, settled
from measure import client_for, enqueue_bulk
from probe import Probe

from jobsd.settings import Settings


async def main_async(url: str, jobs: int, slots: int, ahead: int | None) -> None:
    async with client_for(url) as client:
        await enqueue_bulk(client, jobs, 1000)
    wrote = anyio.Event()
    probe = Probe(on_call=lambda: wrote.set())
    settings = Settings(database_url=url, slots=slots, claim_ahead=ahead, handlers=[])
    with probe.installed():
        t0, c0 = time.perf_counter(), time.process_time()
        async with running_daemon(settings, bench_registry()) as daemon:
            while settled(daemon) < jobs:
                await wrote.wait()
                wrote = anyio.Event()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rate, per_job = jobs / wall, cpu / jobs * 1e6
    print(f"{jobs} jobs, {slots} slots: {rate:,.0f} jobs/s, {per_job:.0f} µs CPU/job")
    for name, s in sorted(probe.stats.items()):
        if s.calls:
            print(f"  {name}: {s.calls} calls, {s.rows / s.calls:.1f} rows/call")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--claim-ahead", type=int, default=None)
    args = parser.parse_args()
    anyio.run(main_async, args.url, args.jobs, args.slots, args.claim_ahead)


if __name__ == "__main__":
    main()
