"""What every case shares: sizes, figures, the meter, a fresh database, a client.

A throughput case returns a ``Rate``: the wall time of its timed section, and the CPU
that the bench process, Postgres (all its processes) and the rest of the machine used
meanwhile. Warm-up (pool connections, prepared statements) happens before the timed
section.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from server import BenchServer, cpu_of

import jobsd
from jobsd.settings import Settings
from jobsd.store import admin

__all__ = [
    "ORG",
    "TYPE",
    "Latency",
    "Meter",
    "Rate",
    "Sizes",
    "case_db",
    "client_for",
    "enqueue_bulk",
    "nearest_rank",
    "onoff",
    "table",
]

ORG = "bench"
TYPE = "noop"
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Sizes:
    """How many jobs each case uses."""

    floor: int = 2_000
    single: int = 5_000
    bulk: int = 50_000
    bulk_batch: int = 1_000
    concurrent: int = 16_000
    enqueuers: int = 8
    server_side_s: int = 4
    drain: int = 20_000
    drain_sleep_ms: tuple[float, float] = (0.0, 4.0)
    latency: int = 200
    latency_gap_ms: tuple[float, float] = (10.0, 40.0)
    warmup: int = 100


@dataclass(slots=True)
class Rate:
    """One throughput figure; CPU in seconds over the timed section."""

    case: str
    notify: str
    n: int
    seconds: float = math.nan
    client_cpu_s: float | None = None
    pg_cpu_s: float | None = None
    other_cpu_share: float | None = None
    wal_bytes: int | None = None
    note: str = ""
    anatomy: dict[str, Any] | None = None
    lib: str = "jobsd"

    @property
    def per_s(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else math.nan


@dataclass(slots=True)
class Latency:
    """One pickup-latency distribution, in seconds."""

    case: str
    notify: str
    poll_s: float
    samples: list[float] = field(default_factory=list)
    note: str = ""
    lib: str = "jobsd"


def _machine_busy_s() -> float:
    """Return the CPU seconds all CPUs have been busy since boot (from /proc/stat)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...: all but idle and iowait
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICK


def _own_cpu_s() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


class Meter:
    """Take wall, CPU and WAL readings around a timed section.

    The CPU of the meter's own backend (its LSN readings, and the polls of a case that
    waits for a worker process on this connection) is left out of Postgres's. With
    ``client_cpu`` (a worker process's CPU reading) the client column is that process,
    not the bench's.
    """

    def __init__(self, server: BenchServer, conn: psycopg.AsyncConnection[Any]) -> None:
        self.server = server
        self.conn = conn
        self.backend_pid = conn.info.backend_pid
        self._start: tuple[float, float, float | None, float, int, float] | None = None
        self._client_cpu: Callable[[], float] = _own_cpu_s
        self._bench0 = 0.0

    async def _lsn(self) -> int:
        cur = await self.conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    def _observer_s(self) -> float:
        return cpu_of(self.backend_pid, children=False) or 0.0

    async def start(self, client_cpu: Callable[[], float] = _own_cpu_s) -> None:
        self._client_cpu = client_cpu
        self._bench0 = _own_cpu_s()
        lsn = await self._lsn()
        pg = self.server.cpu_s()
        self._start = (
            time.perf_counter(),
            client_cpu(),
            pg,
            _machine_busy_s(),
            lsn,
            self._observer_s(),
        )

    async def stop(self, rate: Rate) -> Rate:
        wall, own, pg, busy, observer = (
            time.perf_counter(),
            self._client_cpu(),
            self.server.cpu_s(),
            _machine_busy_s(),
            self._observer_s(),
        )
        lsn = await self._lsn()
        assert self._start is not None
        wall0, own0, pg0, busy0, lsn0, observer0 = self._start
        rate.seconds = wall - wall0
        rate.client_cpu_s = own - own0
        if pg is not None and pg0 is not None:
            rate.pg_cpu_s = (pg - pg0) - (observer - observer0)
            other = (busy - busy0) - rate.client_cpu_s - (pg - pg0)
            if self._client_cpu is not _own_cpu_s:
                other -= _own_cpu_s() - self._bench0
            rate.other_cpu_share = max(other, 0.0) / (rate.seconds * (os.cpu_count() or 1))
        rate.wal_bytes = lsn - lsn0
        return rate


@asynccontextmanager
async def case_db(
    server: BenchServer, name: str, *, notify: bool = True, migrated: bool = True
) -> AsyncIterator[tuple[str, Meter]]:
    """Yield a fresh database (NOTIFY trigger switched as asked; empty unless
    ``migrated``) and a meter on it."""
    async with server.fresh_database(name, migrated=migrated) as url:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            if not notify:
                await admin.set_notify(conn, False)
            yield url, Meter(server, conn)
        finally:
            await conn.close()


def client_for(url: str, pool_size: int = 4) -> jobsd.Client:
    """Return a client on ``url`` with a pool of up to ``pool_size`` connections."""
    return jobsd.Client(url, settings=Settings(database_url=url, pool_size=pool_size))


async def enqueue_bulk(client: jobsd.Client, n: int, batch: int, start: int = 0) -> None:
    """Enqueue ``n`` jobs with enqueue_many, ``batch`` per call."""
    for lo in range(start, start + n, batch):
        hi = min(lo + batch, start + n)
        await client.enqueue_many(
            [jobsd.client.JobSpec.build(TYPE, {"i": i}, org_id=ORG) for i in range(lo, hi)]
        )


def onoff(notify: bool) -> str:
    return "on" if notify else "off"


def table(head: list[str], rows: list[list[str]]) -> str:
    """Format a markdown table."""
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def nearest_rank(ordered: list[float], q: float) -> float:
    """Return the nearest-rank ``q`` quantile of the sorted ``ordered``."""
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]
