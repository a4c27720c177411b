"""Scale and time (issue 10 item 6): a steady soak, the claim from 10^3 to 10^6 queued
jobs, and 1, 2 and 4 daemon processes draining one queue.

    uv run --group bench python bench/soak.py                       # all three parts
    uv run --group bench python bench/soak.py --only soak --minutes 10 --rate 1000
    uv run --group bench python bench/soak.py --only scale --max-jobs 1000000
    uv run --group bench python bench/soak.py --only daemons --jobs 20000

Soak: a producer enqueues ``--rate`` jobs/s (batches of 1/20 s) for ``--minutes`` while
``--daemons`` daemon processes (``run_daemon``, default settings) drain them. Every 5 s
it samples dead and live tuples of jobs and job_events (``pg_stat_user_tables``), the
queue depth, each daemon's RSS (``/proc``), and the pickup latency of the jobs started
in the window (the handler's first CLOCK_MONOTONIC reading minus the producer's right
after the batch's commit). Prints a markdown table and, with ``--plot FILE``, draws a
PNG (matplotlib, bench group only).

Scale: one database, jobs added in bulk up to 10^3, 10^4, ... ``--max-jobs`` queued;
at each size the median and p99 of 50 claim rounds of 10 (``queries.claim_batch``, the
daemon's statement), the claimed jobs then finished so the queue stays at its size.

Daemons: ``--jobs`` jobs enqueued first, then 1, 2 and 4 daemon processes started
together, timed until no job is open.

Without ``--database-url`` it runs on a throwaway embedded Postgres (fsync on).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import psycopg
from measure import ORG, TYPE, client_for, enqueue_bulk, nearest_rank, table
from server import BenchServer
from worker_process import WorkerProcess, worker_process

import jobsd
from jobsd.client import JobSpec
from jobsd.store import queries
from jobsd.store.queries import FinishRow

_SAMPLE_S = 5.0
_STATS_SQL = """
SELECT relname, n_live_tup, n_dead_tup, autovacuum_count + vacuum_count AS vacuums
FROM pg_stat_user_tables WHERE schemaname = 'jobsd' AND relname IN ('jobs', 'job_events')
"""


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _read_starts(path: Path, offset: int) -> tuple[dict[int, float], int]:
    with open(path) as fh:
        fh.seek(offset)
        data = fh.read()
    # only whole lines: a line being written is read next time
    cut = data.rfind("\n") + 1
    starts = {}
    for line in data[:cut].splitlines():
        i, t = line.split()
        starts[int(i)] = float(t)
    return starts, offset + cut


async def soak(server: BenchServer, args: argparse.Namespace) -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    async with server.fresh_database("soak") as url:
        record = Path(tempfile.mkdtemp()) / "starts"
        record.touch()
        async with _workers(url, args.daemons, record) as workers:
            for w in workers:
                w.go()
            async with client_for(url) as client:
                conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
                try:
                    samples = await _soak_loop(client, conn, workers, record, args)
                finally:
                    await conn.close()
    return samples


async def _soak_loop(
    client: jobsd.Client,
    conn: psycopg.AsyncConnection[Any],
    workers: list[WorkerProcess],
    record: Path,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    tick = 0.05
    per_tick = max(1, round(args.rate * tick))
    committed: dict[int, float] = {}
    samples: list[dict[str, Any]] = []
    offset = 0
    n = 0
    start = time.monotonic()
    next_tick = start
    next_sample = start + _SAMPLE_S
    end = start + args.minutes * 60
    while time.monotonic() < end:
        await client.enqueue_many(
            [JobSpec.build(TYPE, {"i": i}, org_id=ORG) for i in range(n, n + per_tick)]
        )
        stamp = time.clock_gettime(time.CLOCK_MONOTONIC)
        for i in range(n, n + per_tick):
            committed[i] = stamp
        n += per_tick
        next_tick += tick
        if time.monotonic() >= next_sample:
            starts, offset = _read_starts(record, offset)
            lat = sorted((t - committed.pop(i)) * 1000 for i, t in starts.items() if i in committed)
            cur = await conn.execute(_STATS_SQL)
            stats = {r[0]: r[1:] for r in await cur.fetchall()}
            cur = await conn.execute(
                "SELECT count(*) FROM jobsd.jobs WHERE status IN ('queued', 'running')"
            )
            row = await cur.fetchone()
            sample = {
                "t_s": round(time.monotonic() - start),
                "enqueued": n,
                "open": row[0] if row else 0,
                "jobs_live": stats.get("jobs", (0, 0, 0))[0],
                "jobs_dead": stats.get("jobs", (0, 0, 0))[1],
                "events_dead": stats.get("job_events", (0, 0, 0))[1],
                "vacuums": stats.get("jobs", (0, 0, 0))[2],
                "rss_mib": max(_rss_mib(w.proc.pid) for w in workers),
                "p50_ms": nearest_rank(lat, 0.5) if lat else float("nan"),
                "p99_ms": nearest_rank(lat, 0.99) if lat else float("nan"),
                "started": len(lat),
            }
            samples.append(sample)
            print(
                "  "
                + " ".join(
                    f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in sample.items()
                ),
                file=sys.stderr,
            )
            next_sample += _SAMPLE_S
        delay = next_tick - time.monotonic()
        if delay > 0:
            await anyio.sleep(delay)
    return samples


class _workers:
    """Start ``count`` jobsd daemon processes (default settings); stop them at the end."""

    def __init__(self, url: str, count: int, record: Path | None) -> None:
        self.url, self.count, self.record = url, count, record
        self._cms: list[Any] = []

    async def __aenter__(self) -> list[WorkerProcess]:
        started = []
        for _ in range(self.count):
            cm = worker_process("jobsd", self.url, "default", self.record)
            started.append(await cm.__aenter__())
            self._cms.append(cm)
        return started

    async def __aexit__(self, *exc: Any) -> None:
        for cm in reversed(self._cms):
            await cm.__aexit__(None, None, None)


async def claim_scale(server: BenchServer, args: argparse.Namespace) -> list[list[str]]:
    rows = []
    async with server.fresh_database("scale") as url:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            size = 0
            target = 1_000
            while target <= args.max_jobs:
                await conn.execute(
                    "INSERT INTO jobsd.jobs (org_id, type, payload) "
                    "SELECT %s, %s, jsonb_build_object('i', g) FROM generate_series(1, %s) g",
                    (ORG, TYPE, target - size),
                )
                size = target
                await conn.execute("VACUUM ANALYZE jobsd.jobs")
                times = []
                for _ in range(50):
                    t = time.perf_counter()
                    claimed = await queries.claim_batch(
                        conn, limit=10, worker_id="scale", queues=None, keep_dedup_types=[]
                    )
                    times.append((time.perf_counter() - t) * 1000)
                    finished = [
                        FinishRow(j.id, j.lease_id, "succeeded", None, None, None, None)
                        for j in claimed
                        if j.lease_id is not None
                    ]
                    await queries.finish_batch(conn, finished)
                    # keep the queue at its size
                    await conn.execute(
                        "INSERT INTO jobsd.jobs (org_id, type) "
                        "SELECT %s, %s FROM generate_series(1, %s)",
                        (ORG, TYPE, len(claimed)),
                    )
                times.sort()
                rows.append(
                    [
                        f"{size:,}",
                        f"{statistics.median(times):.2f}",
                        f"{nearest_rank(times, 0.99):.2f}",
                        "50",
                    ]
                )
                print(f"  claim at {size:,} queued: {rows[-1][1]} ms median", file=sys.stderr)
                target *= 10
        finally:
            await conn.close()
    return rows


async def daemons(server: BenchServer, args: argparse.Namespace) -> list[list[str]]:
    rows = []
    for count in (1, 2, 4):
        async with server.fresh_database(f"daemons{count}") as url:
            async with client_for(url) as client:
                await enqueue_bulk(client, args.jobs, 1000)
            conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
            try:
                async with _workers(url, count, None) as workers:
                    t = time.perf_counter()
                    for w in workers:
                        w.go()
                    while True:
                        cur = await conn.execute(
                            "SELECT EXISTS (SELECT 1 FROM jobsd.jobs "
                            "WHERE status IN ('queued', 'running'))"
                        )
                        row = await cur.fetchone()
                        if row is not None and not row[0]:
                            break
                        await anyio.sleep(0.01)
                    elapsed = time.perf_counter() - t
                cur = await conn.execute(
                    "SELECT count(DISTINCT worker_id), count(*) FILTER "
                    "(WHERE status = 'succeeded') FROM jobsd.jobs"
                )
                row = await cur.fetchone()
                assert row is not None
            finally:
                await conn.close()
            rows.append(
                [
                    str(count),
                    f"{args.jobs:,}",
                    f"{elapsed:.2f}",
                    f"{args.jobs / elapsed:,.0f}",
                    f"{row[1]:,}",
                    str(row[0]),
                ]
            )
            print(f"  {count} daemons: {rows[-1][3]} jobs/s", file=sys.stderr)
    return rows


def plot(samples: list[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t_s"] for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(8, 9), sharex=True)
    axes[0].plot(t, [s["jobs_dead"] for s in samples], label="jobs dead tuples")
    axes[0].plot(t, [s["events_dead"] for s in samples], label="job_events dead tuples")
    axes[0].legend(loc="upper left")
    rss = [s["rss_mib"] for s in samples]
    axes[1].plot(t, rss, label="daemon RSS (MiB)")
    # headroom: a flat line at the top of the axes hides behind its frame
    axes[1].set_ylim(0, max(rss) * 1.3)
    axes[1].legend(loc="lower right")
    axes[2].plot(t, [s["p50_ms"] for s in samples], label="pickup p50 (ms)")
    axes[2].plot(t, [s["p99_ms"] for s in samples], label="pickup p99 (ms)")
    axes[2].set_yscale("log")  # the warm-up's first seconds would flatten the rest
    axes[2].legend(loc="upper right")
    axes[3].plot(t, [s["open"] for s in samples], label="open jobs (queued + running)")
    axes[3].set_ylim(bottom=0)
    axes[3].legend(loc="lower right")
    axes[3].set_xlabel("seconds")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


async def main_async(args: argparse.Namespace) -> None:
    server = BenchServer(args.database_url, fsync=True)
    try:
        info = server.setup()
        print(f"# soak ({info.version}, {info.where}, fsync={info.fsync})\n")
        if "soak" in args.only:
            samples = await soak(server, args)
            head = [
                "s",
                "enqueued",
                "open",
                "jobs live",
                "jobs dead",
                "events dead",
                "vacuums",
                "RSS MiB",
                "p50 ms",
                "p99 ms",
            ]
            keys = [
                "t_s",
                "enqueued",
                "open",
                "jobs_live",
                "jobs_dead",
                "events_dead",
                "vacuums",
                "rss_mib",
                "p50_ms",
                "p99_ms",
            ]
            every = max(1, len(samples) // 12)
            print(f"## Soak: {args.rate} jobs/s for {args.minutes} min, {args.daemons} daemon(s)\n")
            print(table(head, [[_fmt(s[k]) for k in keys] for s in samples[::every]]))
            if args.plot:
                plot(samples, args.plot, f"jobsd soak: {args.rate} jobs/s, {args.minutes} min")
                print(f"\nplot: {args.plot}")
        if "scale" in args.only:
            print("\n## Claim round of 10 by queue size\n")
            print(
                table(["queued", "median ms", "p99 ms", "rounds"], await claim_scale(server, args))
            )
        if "daemons" in args.only:
            print("\n## Daemon processes draining one queue (default settings)\n")
            head = ["daemons", "jobs", "s", "jobs/s", "succeeded", "workers seen"]
            print(table(head, await daemons(server, args)))
    finally:
        server.cleanup()


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--database-url")
    parser.add_argument(
        "--only",
        nargs="+",
        default=["soak", "scale", "daemons"],
        choices=("soak", "scale", "daemons"),
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--daemons", type=int, default=1)
    parser.add_argument("--plot")
    parser.add_argument("--max-jobs", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args()
    os.environ.setdefault("JOBSD_LOG_LEVEL", "WARNING")
    anyio.run(main_async, args)


if __name__ == "__main__":
    main()
