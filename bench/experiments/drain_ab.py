"""Scratch: in-process drains of no-op jobs, for before/after pairs across checkouts.

    uv run python bench/experiments/drain_ab.py [--database-url URL] [--jobs 20000]
        [--slots 10] [--rounds 3]

Run it from each checkout's environment (``cd other && uv run python
/path/to/this/drain_ab.py``): ``jobsd`` comes from the environment, the helpers from
this folder. Each round enqueues ``--jobs`` no-op jobs into a fresh clone, runs one
daemon in this process until every outcome is written, and prints the drain rate, the
process CPU per job and the statements per job of each query function the daemon
calls (claim, start, finish, ...). The median of the rounds closes the output.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from functools import wraps
from typing import Any

import anyio
from common import DEFAULT_URL, scratch
from daemon_cases import bench_registry, running_daemon, settled
from measure import client_for, enqueue_bulk

from jobsd.settings import Settings
from jobsd.store import queries

_COUNTED = (
    "claim_batch",
    "start_reserved",
    "arm_claimed_ahead",
    "finish_batch",
    "finish_and_start",
    "promote_due",
)


def _count(calls: Counter[str]) -> Callable[[], None]:
    """Wrap the daemon's query functions to count their calls; return the undo."""
    saved: dict[str, Any] = {}
    for name in _COUNTED:
        fn = getattr(queries, name, None)
        if fn is None:
            continue
        saved[name] = fn

        def wrapper(fn: Any = fn, name: str = name) -> Any:
            @wraps(fn)
            async def counted(*args: Any, **kwargs: Any) -> Any:
                calls[name] += 1
                return await fn(*args, **kwargs)

            return counted

        setattr(queries, name, wrapper())

    def undo() -> None:
        for name, fn in saved.items():
            setattr(queries, name, fn)

    return undo


def postgres_cpu() -> float:
    """CPU seconds so far of every process of this machine named postgres (the local
    server's backends: those that ended since are not counted, nor are ours)."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as fh:
                if not fh.read().startswith("postgres"):
                    continue
            with open(f"/proc/{pid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except OSError:
            continue
    return total / 1e9


async def one_round(url: str, jobs: int, slots: int) -> tuple[float, float, float, Counter[str]]:
    async with client_for(url) as client:
        await enqueue_bulk(client, jobs, 1000)
    calls: Counter[str] = Counter()
    undo = _count(calls)
    settings = Settings(database_url=url, slots=slots, handlers=[])
    try:
        t0, c0, p0 = time.perf_counter(), time.process_time(), postgres_cpu()
        async with running_daemon(settings, bench_registry()) as daemon:
            while settled(daemon) < jobs:  # noqa: ASYNC110 (a poll, not a handshake)
                await anyio.sleep(0.002)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        pg = postgres_cpu() - p0
    finally:
        undo()
    return jobs / wall, cpu / jobs * 1e6, pg / jobs * 1e6, calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates, cpus = [], []
    with scratch(args.database_url) as s:
        for n in range(args.rounds):
            url = s.clone(f"drain{n}")
            rate, cpu, pg, calls = anyio.run(one_round, url, args.jobs, args.slots)
            rates.append(rate)
            cpus.append(cpu)
            per_job = ", ".join(f"{k} {v / args.jobs:.3f}" for k, v in sorted(calls.items()))
            print(
                f"round {n}: {rate:,.0f} jobs/s, {cpu:.0f} µs CPU/job here, "
                f"{pg:.0f} in Postgres; per job: {per_job}"
            )
    print(
        f"median of {args.rounds}: {statistics.median(rates):,.0f} jobs/s, "
        f"{statistics.median(cpus):.0f} µs CPU/job ({args.jobs} jobs, {args.slots} slots)"
    )


if __name__ == "__main__":
    main()
