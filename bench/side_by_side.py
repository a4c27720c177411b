"""Side by side: the same cases on jobsd and on peer libraries, same cluster, same run.

Each library gets its own fresh database per case (jobsd: a clone of the migrated
template; a peer: an empty database and its documented schema install) and its worker
in its own process (bench/peer_worker.py), also jobsd's. Cases, payload one integer,
no-op handlers:

- enqueue one job per call, on one producer connection, in the bench process;
- enqueue 1,000 jobs per call (the library's bulk call);
- drain at each library's default worker settings, and at its best (``libs.<lib>``);
- pickup latency on an idle worker (its default settings).

A drain's section runs from telling the ready worker to start until a poll (every
10 ms, on the meter's connection, whose backend CPU is left out) finds no unfinished
job; its client CPU is the worker process's.
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from pathlib import Path

import anyio
from libs import adapter
from measure import Latency, Rate, Sizes, case_db, nearest_rank, table
from server import BenchServer
from worker_process import worker_process

__all__ = [
    "POLL_S",
    "side_bulk",
    "side_drain",
    "side_latency",
    "side_report",
    "side_single",
]

POLL_S = 0.01


def _clock() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


async def _install(lib: str, url: str) -> None:
    await adapter(lib).install(url)


def _db(server: BenchServer, lib: str, case: str):  # type: ignore[no-untyped-def]
    return case_db(server, f"{lib}_{case}", migrated=lib == "jobsd")


async def side_single(server: BenchServer, sizes: Sizes, lib: str) -> Rate:
    """Enqueue one job per call, sequentially, on one producer."""
    rate = Rate("enqueue, one job per call", "on", sizes.single, lib=lib)
    async with _db(server, lib, "single") as (url, meter):
        await _install(lib, url)
        async with adapter(lib).producer(url) as p:
            for i in range(sizes.warmup):
                await p.enqueue_one(-i)
            await meter.start()
            for i in range(sizes.single):
                await p.enqueue_one(i)
            return await meter.stop(rate)


async def side_bulk(server: BenchServer, sizes: Sizes, lib: str) -> Rate:
    """Enqueue ``bulk_batch`` jobs per call."""
    b = sizes.bulk_batch
    rate = Rate(f"enqueue, {b:,} jobs per call", "on", sizes.bulk, lib=lib)
    async with _db(server, lib, "bulk") as (url, meter):
        await _install(lib, url)
        async with adapter(lib).producer(url) as p:
            await p.enqueue_many(range(-b, 0))
            await meter.start()
            for lo in range(0, sizes.bulk, b):
                await p.enqueue_many(range(lo, min(lo + b, sizes.bulk)))
            return await meter.stop(rate)


async def _wait_finished(conn, sql: str, deadline_s: float) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``sql`` (true while a job is unfinished) until false; False on the deadline."""
    with anyio.move_on_after(deadline_s):
        while True:
            cur = await conn.execute(sql)
            row = await cur.fetchone()
            if not row[0]:
                return True
            await anyio.sleep(POLL_S)
    return False


async def side_drain(server: BenchServer, sizes: Sizes, lib: str, setting: str) -> Rate:
    """Pre-enqueue jobs; time the worker process from go until every job is finished."""
    a = adapter(lib)
    n = sizes.drain
    rate = Rate(f"drain, {setting} settings", "on", n, lib=lib)
    rate.note = a.SETTINGS[setting].label
    async with _db(server, lib, f"drain_{setting}") as (url, meter):
        await _install(lib, url)
        async with a.producer(url) as p:
            for lo in range(0, n, sizes.bulk_batch):
                await p.enqueue_many(range(lo, min(lo + sizes.bulk_batch, n)))
        async with worker_process(lib, url, setting) as worker:
            await meter.start(client_cpu=worker.cpu_s)
            worker.go()
            done = await _wait_finished(meter.conn, a.OPEN_JOBS_SQL, 240)
            rate = await meter.stop(rate)
        if not done:
            rate.note += "; not finished after 240 s"
    return rate


async def side_latency(server: BenchServer, sizes: Sizes, lib: str) -> Latency:
    """An idle worker (default settings); jobs enqueued one at a time, 10-40 ms apart.

    Latency = the handler's first clock reading minus the producer's right after the
    enqueue call returned (the commit), both CLOCK_MONOTONIC, across processes.
    """
    a = adapter(lib)
    n = sizes.latency
    result = Latency("pickup latency, idle worker", "on", 0.0, lib=lib)
    rng = random.Random(2)
    lo, hi = sizes.latency_gap_ms
    commits: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "starts"
        async with _db(server, lib, "latency") as (url, meter):
            await _install(lib, url)
            async with (
                a.producer(url) as p,
                worker_process(lib, url, "default", record) as worker,
            ):
                worker.go()
                await p.enqueue_one(-1)  # opens what the producer opens lazily
                await anyio.sleep(1.0)  # the worker is up and idle
                for seq in range(n):
                    await p.enqueue_one(seq)
                    commits[seq] = _clock()
                    await anyio.sleep(rng.uniform(lo, hi) / 1000)
                if not await _wait_finished(meter.conn, a.OPEN_JOBS_SQL, 30):
                    result.note = "not all finished after 30 s"
        starts: dict[int, float] = {}
        for line in record.read_text().splitlines():
            seq, t = line.split()
            starts.setdefault(int(seq), float(t))
    result.samples = [starts[s] - commits[s] for s in range(n) if s in starts]
    if len(result.samples) < n:
        result.note = f"{n - len(result.samples)} of {n} never started"
    return result


# -- report ----------------------------------------------------------------------------


def _per_job_us(x: float | None, n: int) -> str:
    return "n/a" if x is None else f"{x / n * 1e6:,.0f}"


def _ms(lat: Latency) -> tuple[float, float, float] | None:
    xs = sorted(lat.samples)
    if not xs:
        return None
    return nearest_rank(xs, 0.5) * 1000, nearest_rank(xs, 0.99) * 1000, xs[-1] * 1000


def _rate_of(per_lib: dict[str, Rate], lib: str) -> float:
    r = per_lib.get(lib)
    return math.nan if r is None or r.n == 0 else r.per_s


def side_report(libs: list[str], rates: list[Rate], latencies: list[Latency]) -> str:
    """The side-by-side tables: ratios first, then each library's CPU and WAL per job."""
    by_case: dict[str, dict[str, Rate]] = {}
    for r in rates:
        by_case.setdefault(r.case, {})[r.lib] = r
    peers = libs[1:]
    head = ["case", *libs]
    for peer in peers:
        head.append(f"jobsd ÷ {peer}")
    rows = []
    for case, per_lib in by_case.items():
        row = [case, *(f"{_rate_of(per_lib, lib):,.0f}/s" for lib in libs)]
        for peer in peers:
            row.append(f"**{_rate_of(per_lib, 'jobsd') / _rate_of(per_lib, peer):.2f}**")
        rows.append(row)
    lat_by_lib = {lat.lib: _ms(lat) for lat in latencies}
    if latencies:
        row = ["pickup on an idle worker, p50 / p99 / max ms"]
        for lib in libs:
            ms = lat_by_lib.get(lib)
            row.append("-" if ms is None else " / ".join(f"{x:.2f}" for x in ms))
        jobsd_ms = lat_by_lib.get("jobsd")
        for peer in peers:
            peer_ms = lat_by_lib.get(peer)
            if jobsd_ms is None or peer_ms is None:
                row.append("-")
            else:  # a time: lower is better, so the ratio is inverted to read like the rest
                row.append(f"**{peer_ms[1] / jobsd_ms[1]:.2f}** (p99, {peer} ÷ jobsd)")
        rows.append(row)
    out = [
        "## Side by side (jobs/s; ratio > 1: jobsd is faster)",
        "",
        table(head, rows),
        "",
        "## Per library: CPU and WAL per job",
        "",
    ]
    head = [
        "case",
        "library",
        "N",
        "s",
        "jobs/s",
        "µs client CPU/job",
        "µs Postgres CPU/job",
        "WAL B/job",
        "other load",
        "settings; note",
    ]
    rows = []
    for case, per_lib in by_case.items():
        for lib in libs:
            r = per_lib.get(lib)
            if r is None:
                continue
            if math.isnan(r.seconds):
                rows.append([case, lib, f"{r.n:,}", "-", "-", "-", "-", "-", "-", r.note])
                continue
            rows.append(
                [
                    case,
                    lib,
                    f"{r.n:,}",
                    f"{r.seconds:.2f}",
                    f"**{r.per_s:,.0f}**",
                    _per_job_us(r.client_cpu_s, r.n),
                    _per_job_us(r.pg_cpu_s, r.n),
                    "n/a" if r.wal_bytes is None else f"{r.wal_bytes / r.n:,.0f}",
                    "n/a" if r.other_cpu_share is None else f"{r.other_cpu_share:.0%}",
                    r.note,
                ]
            )
    out += [table(head, rows), ""]
    if latencies:
        head = ["pickup latency, idle worker", "N", "p50 ms", "p99 ms", "max ms", "note"]
        rows = []
        for lat in latencies:
            ms = _ms(lat)
            cells = ["-"] * 3 if ms is None else [f"{x:,.2f}" for x in ms]
            rows.append([lat.lib, f"{len(lat.samples)}", *cells, lat.note])
        out += [table(head, rows), ""]
    out += [
        "Client CPU: the bench process for the enqueue cases (the producer), the worker "
        "process for the drains. Postgres CPU: all its processes but the meter's backend.",
    ]
    return "\n".join(out)
