"""Measure jobsd beside millions of finished jobs: the same figures on an empty database
and on a filled one, in one run, with their ratio.

    JOBSD_ALLOW_INSECURE=1 uv run python bench/scale.py \\
        --database-url postgresql://postgres@127.0.0.1:5432/postgres [--jobs 10000000] [--keep]
    JOBSD_ALLOW_INSECURE=1 uv run python bench/scale.py --database-url URL --reuse  # again
    uv run python bench/scale.py --quick        # 100,000 jobs, throwaway cluster: a smoke run
    uv run python bench/scale.py --only fill sizes --jobs 1000000 --json scale.json

Two databases on one server, named after the schema version of the jobsd imported
(``scale_empty_v27``, ``scale_full_v27``; ``--db-prefix`` changes ``scale``):

- empty: migrated, and 200 seed jobs (queued, of org ``scale-acme``, in the paused
  queue ``scale-parked``);
- full: the same seed, ``--jobs`` finished jobs (three history rows each) that ended
  over the last 182 days (seven UTC months), of four orgs and six types, 5 % failed,
  and ``--open`` open jobs (half queued in the paused queue, half scheduled a year
  ahead: open all through the run).

The layout is read from the database: with ``jobsd.jobs_archive`` the finished jobs go
straight into the archive's monthly partitions, with the months' contents; without it
(the single-table layout of earlier versions) into jobsd.jobs and jobsd.job_events,
triggers off. Rows are made on the server (bench/scale_fill.sql), ``--fill-workers``
connections at once, then VACUUM ANALYZE and a CHECKPOINT; the times are printed.

Measured on each database the same way, one measure on both before the next (``--only``
picks):

- sizes: total and index size of jobsd.jobs, jobsd.job_events and the archive's two
  tables (summed over their partitions);
- list: ``jobsd jobs list --org scale-acme --limit 50`` as the CLI runs it (the ops
  call, as the operator), and the same with ``--type export.csv`` (a type of ended jobs
  only), p95 of 200 calls each;
- overview: the dashboard overview's read (``read_overview``, 60 minutes, 10 failures)
  as the operator and as one org, p95 of 100 calls each;
- get: ``GET /jobs/{id}`` through the app in-process, with an org token (as
  bench/api_reads.py): the seed jobs (in the hot table) and, on the full database,
  random filled jobs, alternately; p99 of 2,000 reads each;
- sweep: ``Sweeper.run_once()`` (death check and stale sweep) with nothing stale, 30 passes;
- latency: bench/bench.py's pickup case (idle daemon, NOTIFY on), p50 and p99;
- drain: bench/bench.py's drain case (``--drain-jobs`` enqueued, one daemon, no-op
  handler, timed until every outcome is written), jobs/s and Postgres CPU per job;
- vacuum: one daemon drains while jobs come in at ``--vacuum-rate`` for
  ``--vacuum-drain-s``; from pg_stat_user_tables of jobsd.jobs (read every second):
  autovacuum and autoanalyze runs, the most dead tuples seen, live tuples at the end;
- prune (full database only, last): ``jobsd.admin.retention.prune`` with a retention
  for every filled type that makes exactly the oldest month due; its seconds, the jobs
  deleted, the dead tuples it left in the job tables.

Without ``--database-url`` a throwaway cluster is started (as bench/bench.py does) and
removed. With it, the role must be a superuser (it creates and drops the two
databases and fills with triggers off). ``--keep`` keeps the full database;
``--reuse`` measures on a kept one (it refills the month an earlier prune dropped and
deletes what earlier measures enqueued). Prints markdown on stdout, progress on
stderr; ``--json FILE`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
import psycopg
from daemon_cases import bench_registry, case_drain, case_latency, running_daemon, settled
from measure import ORG as MEASURE_ORG
from measure import Sizes, client_for, enqueue_bulk, nearest_rank, table
from psycopg import sql
from server import BenchServer, ServerInfo, db_url_for

from jobsd.errors import MigrationError
from jobsd.http.app import create_app
from jobsd.http.settings import HttpSettings
from jobsd.ops.caller import Caller
from jobsd.ops.listing import list_jobs
from jobsd.ops.overview import read_overview
from jobsd.registry import Registry
from jobsd.settings import Settings
from jobsd.store.connect import connect_async, make_async_pool
from jobsd.store.migrate import migrate_sync
from jobsd.store.sqlfiles import load_migrations
from jobsd.worker.clock import SYSTEM_CLOCK
from jobsd.worker.stats import DaemonStats
from jobsd.worker.sweeper import Sweeper, SweeperSettings

ORGS = (
    ("scale-acme", 0.50),
    ("scale-globex", 0.25),
    ("scale-initech", 0.15),
    ("scale-umbrella", 0.10),
)
# (type, queue, share of the jobs)
TYPES = (
    ("email.send", "default", 0.40),
    ("webhook.deliver", "default", 0.25),
    ("image.resize", "default", 0.15),
    ("report.build", "scale-batch", 0.10),
    ("invoice.sync", "default", 0.07),
    ("export.csv", "scale-batch", 0.03),
)
FAILED_SHARE = 0.05
SPAN = timedelta(days=182)
# no job ends in the first days of the second month: a retention of whole days can
# then make exactly the oldest month due, on either layout
GAP = timedelta(days=2)
RECENT = timedelta(minutes=10)
PARKED = "scale-parked"
SEED = 200
READ_ORG = ORGS[0][0]
# seed and open jobs are of the first four types: a page of this one is all ended jobs
LIST_TYPE = TYPES[-1][0]
CHUNK = 100_000
FILL_SQL = Path(__file__).with_name("scale_fill.sql")
MEASURES = ("sizes", "list", "overview", "get", "sweep", "latency", "drain", "vacuum", "prune")
MEASURE_TIMEOUT_S = 3600.0


@dataclass(frozen=True, slots=True)
class Run:
    """How much of everything a run uses."""

    jobs: int
    open: int
    drain: int
    latency: int
    reads: int
    lists: int
    overviews: int
    sweeps: int
    vacuum_s: float
    vacuum_rate: int
    slots: int


@dataclass(frozen=True, slots=True)
class Db:
    """One of the two databases."""

    role: str  # "empty" or "full"
    name: str
    url: str
    layout: str  # "archive" or "single"


@dataclass(slots=True)
class Month:
    """The filled jobs that ended in one UTC month: numbers [first, first + jobs)."""

    month: datetime
    lo: datetime
    hi: datetime
    first: int
    jobs: int
    filled: bool = False


@dataclass(slots=True)
class FillReport:
    """What the fill of the full database did and took."""

    reused: bool = False
    jobs_s: float = 0.0
    jobs_filled: int = 0
    open_s: float = 0.0
    vacuum_s: float = 0.0
    checkpoint_s: float = 0.0
    months: list[str] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.jobs_s + self.open_s + self.vacuum_s + self.checkpoint_s


Figures = dict[str, Any]


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- the fill --------------------------------------------------------------------------


def _named(text: str) -> dict[str, str]:
    """Split bench/scale_fill.sql into its named statements (comment lines dropped)."""
    blocks: dict[str, str] = {}
    parts = re.split(r"^-- name: (\w+)\s*$", text, flags=re.M)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        blocks[name] = "\n".join(lines)
    return blocks


STATEMENTS = _named(FILL_SQL.read_text(encoding="utf-8"))


def _cuts(shares: list[float]) -> list[float]:
    """Return the cumulative bounds width_bucket needs to pick among ``shares``."""
    out, total = [], 0.0
    for share in shares[:-1]:
        total += share
        out.append(total)
    return out


FILL_PARAMS: dict[str, Any] = {
    "orgs": [o for o, _ in ORGS],
    "org_cuts": _cuts([s for _, s in ORGS]),
    "types": [t for t, _, _ in TYPES],
    "type_queues": [q for _, q, _ in TYPES],
    "type_cuts": _cuts([s for _, _, s in TYPES]),
    "failed_share": FAILED_SHARE,
}


def month_of(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(month: datetime) -> datetime:
    return (month + timedelta(days=32)).replace(day=1)


def plan(anchor: datetime, jobs: int) -> list[Month]:
    """Spread ``jobs`` ends evenly over ``SPAN`` before ``anchor`` (minus the gap),
    month by month."""
    start, end = anchor - SPAN, anchor - RECENT
    pieces: list[tuple[datetime, datetime, datetime]] = []
    month = month_of(start)
    while month < end:
        lo, hi = max(month, start), min(next_month(month), end)
        if len(pieces) == 1:
            lo = month + GAP
        pieces.append((month, lo, hi))
        month = next_month(month)
    total_s = sum((hi - lo).total_seconds() for _, lo, hi in pieces)
    months, first, seconds = [], 0, 0.0
    for month, lo, hi in pieces:
        seconds += (hi - lo).total_seconds()
        last = round(jobs * seconds / total_s)
        months.append(Month(month, lo, hi, first, last - first))
        first = last
    return months


def _us(moment: datetime) -> int:
    return round(moment.timestamp() * 1_000_000)


def _chunks(months: list[Month]) -> list[tuple[Month, int, int, int, int]]:
    """Return (month, first, n, lo_us, span_us) for every chunk of the months to fill."""
    out = []
    for m in months:
        span_us = _us(m.hi) - _us(m.lo)
        for first in range(m.first, m.first + m.jobs, CHUNK):
            n = min(CHUNK, m.first + m.jobs - first)
            lo_us = _us(m.lo) + (first - m.first) * span_us // m.jobs
            out.append((m, first, n, lo_us, n * span_us // m.jobs))
    return out


def _suffix(month: datetime) -> str:
    return f"p{month:%Y_%m}"


async def _fill_chunk(
    conn: psycopg.AsyncConnection[Any], layout: str, chunk: tuple[Month, int, int, int, int]
) -> None:
    m, first, n, lo_us, span_us = chunk
    params = {**FILL_PARAMS, "first": first, "n": n, "lo_us": lo_us, "span_us": span_us}
    source = sql.SQL(STATEMENTS["fill_source"])
    if layout == "archive":
        cur = await conn.execute(
            "SELECT setval('jobsd.job_events_id_seq', nextval('jobsd.job_events_id_seq') + %s)",
            (3 * n - 1,),
        )
        row = await cur.fetchone()
        assert row is not None
        params |= {"event_base": row[0] - 3 * n + 1, "month": m.month}
        stmt = sql.SQL(STATEMENTS["fill_archive"]).format(
            source=source,
            jobs=sql.Identifier("jobsd", f"jobs_archive_{_suffix(m.month)}"),
            events=sql.Identifier("jobsd", f"job_events_archive_{_suffix(m.month)}"),
        )
    else:
        stmt = sql.SQL(STATEMENTS["fill_single"]).format(source=source)
    await conn.execute(stmt, params)


async def fill_jobs(db: Db, months: list[Month], workers: int) -> int:
    """Fill the months not yet filled, ``workers`` connections at once; return the jobs."""
    todo = [m for m in months if not m.filled]
    chunks = _chunks(todo)
    left = {m.month: sum(1 for c in chunks if c[0] is m) for m in todo}
    total = sum(m.jobs for m in todo)
    done = 0
    t0 = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as book:
        if db.layout == "archive" and todo:
            await book.execute(
                "SELECT jobsd.archive_ensure(%s, %s)", (todo[0].lo, todo[-1].hi - RECENT / 2)
            )

        async def worker() -> None:
            nonlocal done
            async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
                await conn.execute("SET synchronous_commit = off")
                if db.layout == "single":
                    await conn.execute("SET session_replication_role = replica")
                while chunks:
                    chunk = chunks.pop(0)
                    await _fill_chunk(conn, db.layout, chunk)
                    done += chunk[2]
                    left[chunk[0].month] -= 1
                    if not left[chunk[0].month]:
                        await book.execute(
                            "UPDATE public.scale_fill SET filled = true WHERE month = %s",
                            (chunk[0].month,),
                        )
                        chunk[0].filled = True
                    rate = done / (time.perf_counter() - t0)
                    log(f"  filled {done:,} of {total:,} jobs ({rate:,.0f}/s)")

        async with anyio.create_task_group() as tg:
            for _ in range(workers):
                tg.start_soon(worker)
    return total


async def read_plan(conn: psycopg.AsyncConnection[Any]) -> list[Month] | None:
    cur = await conn.execute("SELECT to_regclass('public.scale_fill') IS NOT NULL")
    row = await cur.fetchone()
    if not row or not row[0]:
        return None
    cur = await conn.execute(
        "SELECT month, lo, hi, first, jobs, filled FROM public.scale_fill ORDER BY month"
    )
    return [Month(*r) for r in await cur.fetchall()]


async def write_plan(conn: psycopg.AsyncConnection[Any], months: list[Month]) -> None:
    await conn.execute(
        "CREATE TABLE public.scale_fill (month timestamptz PRIMARY KEY, lo timestamptz,"
        " hi timestamptz, first bigint, jobs bigint, filled boolean)"
    )
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO public.scale_fill VALUES (%s, %s, %s, %s, %s, %s)",
            [(m.month, m.lo, m.hi, m.first, m.jobs, m.filled) for m in months],
        )


def _jobs_table(layout: str) -> str:
    return "jobsd.jobs_archive" if layout == "archive" else "jobsd.jobs"


async def check_months(db: Db, conn: psycopg.AsyncConnection[Any], months: list[Month]) -> None:
    """Mark for filling the months with no filled job (a prune dropped them); refuse a
    month half there (an interrupted fill)."""
    types = [t for t, _, _ in TYPES]
    count = sql.SQL(
        "SELECT count(*) FROM {} WHERE finished_at >= %s AND finished_at < %s AND type = ANY(%s)"
    ).format(sql.SQL(_jobs_table(db.layout)))
    for m in months:
        row = await (await conn.execute(count, (m.lo, m.hi, types))).fetchone()
        found = row[0] if row else 0
        if found == 0 and m.filled:
            log(f"  month {m.month:%Y-%m} is gone (pruned): filling it again")
            m.filled = False
            await conn.execute(
                "UPDATE public.scale_fill SET filled = false WHERE month = %s", (m.month,)
            )
        elif found and (found != m.jobs or not m.filled):
            raise SystemExit(
                f"{db.name}: month {m.month:%Y-%m} holds {found:,} filled jobs, not {m.jobs:,}"
                " (an interrupted fill?): run without --reuse to fill the database again"
            )


async def prepare(db: Db, conn: psycopg.AsyncConnection[Any]) -> None:
    """The queues and the seed jobs both databases have."""
    await conn.execute(
        "INSERT INTO jobsd.queues (name) VALUES ('scale-batch'), (%s) ON CONFLICT DO NOTHING",
        (PARKED,),
    )
    await conn.execute(
        "UPDATE jobsd.queues SET paused_at = now() WHERE name = %s AND paused_at IS NULL",
        (PARKED,),
    )
    cur = await conn.execute(
        "SELECT count(*) FROM jobsd.jobs WHERE queue = %s AND payload ? 'seed'", (PARKED,)
    )
    row = await cur.fetchone()
    if row and row[0] != SEED:
        await conn.execute(
            "DELETE FROM jobsd.jobs WHERE queue = %s AND payload ? 'seed'", (PARKED,)
        )
        await _open_jobs(conn, SEED, "seed", orgs=[READ_ORG], schedule=False)


async def _open_jobs(
    conn: psycopg.AsyncConnection[Any], n: int, tag: str, *, orgs: list[str], schedule: bool
) -> None:
    params = {
        **FILL_PARAMS,
        "orgs": orgs,
        "types": [t for t, _, _ in TYPES[:4]],
        "type_queues": [q for _, q, _ in TYPES[:4]],
        "n": n,
        "tag": tag,
        "parked": PARKED,
        "schedule": schedule,
    }
    await conn.execute(STATEMENTS["open_jobs"], params)


async def fill(db: Db, run: Run, workers: int, reused: bool) -> FillReport:
    """Fill (or complete) the full database; VACUUM ANALYZE and CHECKPOINT after."""
    report = FillReport(reused=reused)
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        months = await read_plan(conn)
        if months is None:
            months = plan(datetime.now(UTC).replace(microsecond=0), run.jobs)
            await write_plan(conn, months)
        elif sum(m.jobs for m in months) != run.jobs:
            have = sum(m.jobs for m in months)
            raise SystemExit(f"{db.name} was filled with {have:,} jobs, not {run.jobs:,}")
        else:
            await check_months(db, conn, months)
            await _forget_measures(db, conn)
        report.months = [f"{m.month:%Y-%m}: {m.jobs:,}" for m in months]
        t = time.perf_counter()
        report.jobs_filled = await fill_jobs(db, months, workers)
        report.jobs_s = time.perf_counter() - t
        t = time.perf_counter()
        cur = await conn.execute(
            "SELECT count(*) FROM jobsd.jobs WHERE payload ? 'open'"
            " AND status IN ('queued', 'scheduled')"
        )
        row = await cur.fetchone()
        if row and row[0] != run.open:
            await conn.execute("DELETE FROM jobsd.jobs WHERE payload ? 'open'")
            await _open_jobs(conn, run.open, "open", orgs=FILL_PARAMS["orgs"], schedule=True)
        report.open_s = time.perf_counter() - t
        if report.jobs_filled or not reused:
            t = time.perf_counter()
            log("  VACUUM ANALYZE ...")
            await _vacuum(db, workers)
            report.vacuum_s = time.perf_counter() - t
            t = time.perf_counter()
            await conn.execute("CHECKPOINT")
            report.checkpoint_s = time.perf_counter() - t
    return report


async def _vacuum(db: Db, workers: int) -> None:
    """VACUUM ANALYZE the job tables (the archive's partitions side by side)."""
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        names = ["jobsd.jobs", "jobsd.job_events"]
        parents: list[str] = []
        if db.layout == "archive":
            parents = ["jobsd.jobs_archive", "jobsd.job_events_archive"]
            cur = await conn.execute(
                "SELECT relid::regclass::text FROM pg_partition_tree('jobsd.jobs_archive')"
                " WHERE isleaf UNION ALL SELECT relid::regclass::text"
                " FROM pg_partition_tree('jobsd.job_events_archive') WHERE isleaf"
            )
            names += [r[0] for r in await cur.fetchall()]
    queue = list(names)

    async def worker() -> None:
        async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
            await conn.execute("SET maintenance_work_mem = '256MB'")
            while queue:
                name = queue.pop(0)
                await conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.SQL(name)))

    async with anyio.create_task_group() as tg:
        for _ in range(workers):
            tg.start_soon(worker)
    # the parents' own statistics (autovacuum never analyzes a partitioned table)
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        for name in parents:
            await conn.execute(sql.SQL("ANALYZE {}").format(sql.SQL(name)))


async def _forget_measures(db: Db, conn: psycopg.AsyncConnection[Any]) -> None:
    """Delete the jobs an earlier run's measures made (org ``bench``) in a kept database."""
    await conn.execute("DELETE FROM jobsd.jobs WHERE org_id = %s", (MEASURE_ORG,))
    if db.layout == "archive":
        await conn.execute("DELETE FROM jobsd.jobs_archive WHERE org_id = %s", (MEASURE_ORG,))
        await conn.execute("DELETE FROM jobsd.job_events_archive WHERE org_id = %s", (MEASURE_ORG,))
        await conn.execute(
            "DELETE FROM jobsd.archive_contents WHERE type <> ALL(%s)", ([t for t, _, _ in TYPES],)
        )
    await conn.execute("VACUUM (ANALYZE) jobsd.jobs, jobsd.job_events")


# -- the databases ---------------------------------------------------------------------


async def _layout(url: str) -> str:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT to_regclass('jobsd.jobs_archive') IS NOT NULL")
        row = await cur.fetchone()
    return "archive" if row and row[0] else "single"


def _exists(admin_url: str, name: str) -> bool:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return row is not None


def create_db(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_db(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


class OneDatabase:
    """What bench/daemon_cases.py's cases need of a ``BenchServer``: the server's CPU
    meter, and a database to run in, here always the same given one (not a fresh clone)."""

    def __init__(self, server: BenchServer, url: str) -> None:
        self._server = server
        self._url = url

    def cpu_s(self) -> float | None:
        return self._server.cpu_s()

    @asynccontextmanager
    async def fresh_database(self, case: str, *, migrated: bool = True) -> AsyncIterator[str]:
        yield self._url


# -- the measures ----------------------------------------------------------------------


def _ms(samples: list[float], q: float) -> float:
    return nearest_rank(sorted(samples), q) * 1000


async def timed(n: int, fn: Callable[[], Awaitable[Any]], warmup: int = 5) -> list[float]:
    """Call ``fn`` ``warmup`` times untimed, then ``n`` times; return each call's seconds."""
    for _ in range(warmup):
        await fn()
    took = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        took.append(time.perf_counter() - t)
    return took


async def _stat_flush(conn: psycopg.AsyncConnection[Any]) -> None:
    """Ask this backend to flush its statistics now (Postgres 15+); others flush
    within a second or so of going idle."""
    if conn.info.server_version >= 150000:
        await conn.execute("SELECT pg_stat_force_next_flush()")


RELATIONS_SQL = """
SELECT coalesce(sum(pg_total_relation_size(x.r)), 0)::bigint,
       coalesce(sum(pg_indexes_size(x.r)), 0)::bigint,
       coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint,
       coalesce(sum(s.n_dead_tup), 0)::bigint
FROM (SELECT t.relid AS r FROM pg_partition_tree(%(rel)s::regclass) AS t WHERE t.isleaf
      UNION ALL
      SELECT %(rel)s::regclass WHERE NOT EXISTS (
        SELECT 1 FROM pg_partition_tree(%(rel)s::regclass))) AS x
JOIN pg_class AS c ON c.oid = x.r
LEFT JOIN pg_stat_user_tables AS s ON s.relid = x.r
"""


def relations(db: Db) -> list[str]:
    names = ["jobsd.jobs", "jobsd.job_events"]
    if db.layout == "archive":
        names += ["jobsd.jobs_archive", "jobsd.job_events_archive"]
    return names


async def m_sizes(db: Db, run: Run, server: BenchServer) -> Figures:
    """Size of each job table (the archive's: all its partitions), its indexes, rows."""
    out: Figures = {}
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        for rel in relations(db):
            cur = await conn.execute(RELATIONS_SQL, {"rel": rel})
            row = await cur.fetchone()
            assert row is not None
            out[rel] = {"total_bytes": row[0], "index_bytes": row[1], "rows_estimate": row[2]}
    return out


async def m_list(db: Db, run: Run, server: BenchServer) -> Figures:
    """``jobsd jobs list --org O --limit 50`` (the first page, newest first), and the
    same with ``--type``: the ops call the CLI makes, as the operator."""
    caller = Caller.as_operator("cli:scale")
    out: Figures = {}
    async with connect_async(db.url, application_name="jobsd-jobs", operation="list") as conn:
        for key, options in (("org", {}), ("org_type", {"type": LIST_TYPE})):
            rows: list[int] = []

            async def page(options: dict[str, Any] = options, rows: list[int] = rows) -> None:
                found = await list_jobs(conn, caller, org_id=READ_ORG, limit=50, **options)
                rows.append(len(found.jobs))

            took = await timed(run.lists, page)
            out[key] = {"p50_ms": _ms(took, 0.5), "p95_ms": _ms(took, 0.95), "rows": rows[-1]}
    return out


async def m_overview(db: Db, run: Run, server: BenchServer) -> Figures:
    """The dashboard's overview read (``read_overview`` as its page calls it), for the
    operator and for one org."""
    from jobsd.http.ui.pages import FAILURES
    from jobsd.http.ui.views import CHART_MINUTES

    out: Figures = {}
    async with connect_async(db.url, application_name="jobsd-ui", operation="overview") as conn:
        callers = (
            ("operator", Caller.as_operator("ui:scale")),
            ("org", Caller.for_org(READ_ORG, "ui:scale")),
        )
        for key, caller in callers:

            async def read(caller: Caller = caller) -> None:
                await read_overview(conn, caller, minutes=CHART_MINUTES, failures=FAILURES)

            took = await timed(run.overviews, read)
            out[key] = {"p50_ms": _ms(took, 0.5), "p95_ms": _ms(took, 0.95)}
    return out


def _org_token(url: str, org: str) -> str:
    """Store a token of ``org`` straight in the table (as bench/api_reads.py does)."""
    import base64
    import hashlib
    import secrets

    made = "jobsd_" + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobsd.api_tokens (org_id, name, prefix, token_hash, admin) "
            "VALUES (%s, 'scale', %s, %s, false)",
            (org, made[:12], hashlib.sha256(made.encode()).digest()),
        )
    return made


async def _filled_ids(db: Db, n: int) -> list[str]:
    """Return ``n`` ids of filled (ended) jobs of the read org, at random times."""
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        months = await read_plan(conn)
        if not months:
            return []
        stmt = sql.SQL(
            "SELECT (SELECT j.id FROM {} AS j WHERE j.org_id = %(org)s AND j.created_at >= p.t"
            " AND j.finished_at IS NOT NULL ORDER BY j.created_at LIMIT 1)"
            " FROM (SELECT %(lo)s::timestamptz + random() * (%(hi)s::timestamptz"
            " - %(lo)s::timestamptz) AS t FROM generate_series(1, %(n)s)) AS p"
        ).format(sql.SQL(_jobs_table(db.layout)))
        lo = next((m.lo for m in months if m.filled), months[0].lo)
        cur = await conn.execute(stmt, {"org": READ_ORG, "lo": lo, "hi": months[-1].hi, "n": n})
        return [str(r[0]) for r in await cur.fetchall() if r[0] is not None]


async def m_get(db: Db, run: Run, server: BenchServer) -> Figures:
    """``GET /jobs/{id}`` through the app in-process (bench/api_reads.py's way): the seed
    jobs (hot), and on the full database random filled ones (archived), interleaved."""
    token = _org_token(db.url, READ_ORG)
    headers = {"Authorization": f"Bearer {token}"}
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT id FROM jobsd.jobs WHERE queue = %s AND payload ? 'seed'", (PARKED,)
        )
        hot = [str(r[0]) for r in await cur.fetchall()]
    filled = await _filled_ids(db, run.reads) if db.role == "full" else []
    app = create_app(Settings(database_url=db.url), HttpSettings(read_rate=None, submit_rate=None))
    took: dict[str, list[float]] = {"hot": [], "filled": []}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://scale") as client:

            async def get(job_id: str) -> float:
                start = time.perf_counter()
                answer = await client.get(f"/jobs/{job_id}", headers=headers)
                took_s = time.perf_counter() - start
                assert answer.status_code == 200, answer.text
                return took_s

            for i in range(50):  # warm: plans, pool, token cache
                await get(hot[i % len(hot)])
            for i in range(run.reads):
                took["hot"].append(await get(hot[i % len(hot)]))
                if filled:
                    took["filled"].append(await get(filled[i % len(filled)]))
    return {
        kind: {"p50_ms": _ms(xs, 0.5), "p99_ms": _ms(xs, 0.99), "n": len(xs)}
        for kind, xs in took.items()
        if xs
    }


async def m_sweep(db: Db, run: Run, server: BenchServer) -> Figures:
    """``Sweeper.run_once()`` (death check and stale sweep) with nothing stale."""
    pool = make_async_pool(db.url, name="scale-sweep", min_size=1, max_size=2, timeout_s=10.0)
    await pool.open(wait=True)
    try:
        cfg = SweeperSettings(
            worker_id=f"scale-sweeper:{os.getpid()}:x",
            death_check_interval_s=5.0,
            sweep_interval_s=60.0,
            stale_after_s=600.0,
            default_max_attempts=1,
        )
        sweeper = Sweeper(pool, cfg, SYSTEM_CLOCK, Registry(), DaemonStats(), lambda job: None)
        counts: list[int] = []

        async def once() -> None:
            counts.append(sum((await sweeper.run_once()).values()))

        took = await timed(run.sweeps, once, warmup=2)
    finally:
        await pool.close()
    return {"p50_ms": _ms(took, 0.5), "p95_ms": _ms(took, 0.95), "rescued": sum(counts)}


async def m_latency(db: Db, run: Run, server: BenchServer) -> Figures:
    """bench/bench.py's pickup case (NOTIFY on, 30 s poll) on this database."""
    one = cast(BenchServer, OneDatabase(server, db.url))
    lat = await case_latency(one, Sizes(latency=run.latency), notify=True, poll_s=30.0)
    xs = sorted(lat.samples)
    return {
        "p50_ms": _ms(xs, 0.5) if xs else None,
        "p99_ms": _ms(xs, 0.99) if xs else None,
        "n": len(xs),
        "note": lat.note,
    }


async def m_drain(db: Db, run: Run, server: BenchServer) -> Figures:
    """bench/bench.py's drain case (no-op handler) on this database."""
    one = cast(BenchServer, OneDatabase(server, db.url))
    rate = await case_drain(one, Sizes(drain=run.drain), run.slots)
    # the case's own check counts jobsd.jobs, which here holds other jobs too (and the
    # archive the drained ones): the daemon's count is the one that holds
    note = "; ".join(
        part for part in rate.note.split("; ") if part and "succeeded in the database" not in part
    )
    return {
        "jobs_per_s": rate.per_s,
        "pg_cpu_us_per_job": None if rate.pg_cpu_s is None else rate.pg_cpu_s / rate.n * 1e6,
        "n": rate.n,
        "note": note,
    }


HOT_STATS_SQL = """
SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count,
       pg_total_relation_size('jobsd.jobs'::regclass)
FROM pg_stat_user_tables WHERE relid = 'jobsd.jobs'::regclass
"""


async def m_vacuum(db: Db, run: Run, server: BenchServer) -> Figures:
    """A daemon drains while jobs come in at a fixed rate; the autovacuum activity on
    jobsd.jobs meanwhile (pg_stat_user_tables, read every second)."""
    settings = Settings(database_url=db.url, slots=run.slots, handlers=[])
    tick = 0.1
    per_tick = max(1, round(run.vacuum_rate * tick))
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        await _stat_flush(conn)
        await anyio.sleep(1.0)
        cur = await conn.execute(HOT_STATS_SQL)
        before = await cur.fetchone()
        assert before is not None
        max_dead = before[1]
        enqueued = 0
        async with (
            client_for(db.url) as client,
            running_daemon(settings, bench_registry()) as daemon,
        ):
            t0 = time.perf_counter()
            end = t0 + run.vacuum_s

            async def feed() -> None:
                nonlocal enqueued
                k = 0
                while time.perf_counter() < end:
                    await enqueue_bulk(client, per_tick, per_tick, start=enqueued)
                    enqueued += per_tick
                    k += 1
                    await anyio.sleep(max(0.0, t0 + k * tick - time.perf_counter()))

            async def watch() -> None:
                nonlocal max_dead
                while time.perf_counter() < end:
                    await anyio.sleep(1.0)
                    got = await (await conn.execute(HOT_STATS_SQL)).fetchone()
                    if got is not None:
                        max_dead = max(max_dead, got[1])

            async with anyio.create_task_group() as tg:
                tg.start_soon(feed)
                tg.start_soon(watch)
            done = settled(daemon)
            wall = time.perf_counter() - t0
        await anyio.sleep(1.5)  # the daemon's backends are gone: their counts are flushed
        after = await (await conn.execute(HOT_STATS_SQL)).fetchone()
        assert after is not None
    return {
        "seconds": wall,
        "enqueued": enqueued,
        "done": done,
        "done_per_s": done / wall,
        "autovacuum": after[2] - before[2],
        "autoanalyze": after[3] - before[3],
        "max_dead": max(max_dead, after[1]),
        "dead_end": after[1],
        "live_end": after[0],
        "bytes_start": before[4],
        "bytes_end": after[4],
    }


async def _dead_tuples(db: Db) -> dict[str, int]:
    """Return n_dead_tup of each job table (the archive's: summed over its partitions)."""
    dead: dict[str, int] = {}
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        for rel in relations(db):
            got = await (await conn.execute(RELATIONS_SQL, {"rel": rel})).fetchone()
            dead[rel] = got[3] if got else 0
    return dead


async def m_prune(db: Db, run: Run, server: BenchServer) -> Figures:
    """``jobsd.admin.retention.prune`` with a retention per filled type that makes the
    oldest month due and nothing else; the dead tuples of the job tables before and after."""
    from jobsd.admin.retention import prune

    if db.role != "full":
        return {}
    async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
        months = await read_plan(conn)
        cur = await conn.execute("SELECT now()")
        row = await cur.fetchone()
    assert months and row is not None
    oldest, second = months[0], months[1]
    # due: ended before now - days, which falls in the second month's first GAP days,
    # where no job ended
    days = math.floor((row[0] - second.month).total_seconds() / 86400)
    retention = {t: days for t, _, _ in TYPES}
    before = await _dead_tuples(db)
    async with connect_async(db.url, application_name="jobsd-prune", operation="prune") as pc:
        report = await prune(pc, type_retention=retention)
    dropped = getattr(report, "months_dropped", None)
    await anyio.sleep(1.5)  # the prune's backend is gone: its counts are flushed
    after = await _dead_tuples(db)
    return {
        "seconds": report.seconds,
        "deleted": report.total,
        "expected": oldest.jobs,
        "days": days,
        "months_dropped": [f"{m:%Y-%m}" for m in dropped] if dropped is not None else None,
        "dead_before": before,
        "dead_after": after,
        "dead_added": sum(max(0, after[k] - before.get(k, 0)) for k in after),
    }


MEASURE_FNS: dict[str, Callable[[Db, Run, BenchServer], Awaitable[Figures]]] = {
    "sizes": m_sizes,
    "list": m_list,
    "overview": m_overview,
    "get": m_get,
    "sweep": m_sweep,
    "latency": m_latency,
    "drain": m_drain,
    "vacuum": m_vacuum,
    "prune": m_prune,
}


# -- the report ------------------------------------------------------------------------


def _num(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:,.{digits}f}"


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: a figure of one measure (at ``path`` in its figures) on
    both databases, times ``scale``."""

    measure: str
    label: str
    path: tuple[str, ...]
    digits: int = 1
    scale: float = 1.0


MB = 1 / 2**20
ROWS = (
    Row("drain", "drain, no-op handler (jobs/s)", ("jobs_per_s",), 0),
    Row("drain", "drain: Postgres CPU per job (µs)", ("pg_cpu_us_per_job",), 0),
    Row("latency", "pickup latency p50 (ms)", ("p50_ms",), 2),
    Row("latency", "pickup latency p99 (ms)", ("p99_ms",), 2),
    Row("get", "GET /jobs/{id} p99, seeded open job (ms)", ("hot", "p99_ms"), 2),
    Row("get", "GET /jobs/{id} p99, filled ended job (ms)", ("filled", "p99_ms"), 2),
    Row("list", "jobs list, one org, first 50, p95 (ms)", ("org", "p95_ms"), 2),
    Row("list", f"jobs list, one org, type {LIST_TYPE}, p95 (ms)", ("org_type", "p95_ms"), 2),
    Row("overview", "dashboard overview p95, operator (ms)", ("operator", "p95_ms"), 2),
    Row("overview", "dashboard overview p95, one org (ms)", ("org", "p95_ms"), 2),
    Row("sweep", "sweeper pass, nothing stale, p50 (ms)", ("p50_ms",), 2),
    Row("sweep", "sweeper pass, nothing stale, p95 (ms)", ("p95_ms",), 2),
    Row("prune", "prune of the oldest month (s)", ("seconds",), 2),
    Row("prune", "prune: jobs deleted", ("deleted",)),
    Row("prune", "prune: dead tuples it left in the job tables", ("dead_added",)),
    Row("vacuum", "steady drain: jobs enqueued", ("enqueued",)),
    Row("vacuum", "steady drain: jobs done per s", ("done_per_s",), 0),
    Row("vacuum", "jobsd.jobs: autovacuum runs", ("autovacuum",)),
    Row("vacuum", "jobsd.jobs: autoanalyze runs", ("autoanalyze",)),
    Row("vacuum", "jobsd.jobs: n_dead_tup, max", ("max_dead",)),
    Row("vacuum", "jobsd.jobs: n_live_tup at the end", ("live_end",)),
    Row("vacuum", "jobsd.jobs: MB at the start", ("bytes_start",), 1, MB),
    Row("vacuum", "jobsd.jobs: MB at the end", ("bytes_end",), 1, MB),
)


def _rows(results: dict[str, dict[str, Figures]]) -> list[Row]:
    sizes = results.get("sizes", {})
    rels = list(sizes.get("full", sizes.get("empty", {})))
    size_rows = [
        Row("sizes", f"{rel}: {what} MB", (rel, key), 1, MB)
        for rel in rels
        if rel != "error"
        for what, key in (("total", "total_bytes"), ("indexes", "index_bytes"))
    ]
    return [*ROWS[:15], *size_rows, *ROWS[15:]]


def _value(figures: Figures | None, row: Row) -> Any:
    if not figures or "error" in figures:
        return None
    value: Any = figures
    for key in row.path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if value is None or row.scale == 1.0:
        return value
    return value * row.scale


def report_table(results: dict[str, dict[str, Figures]]) -> str:
    lines = []
    for row in _rows(results):
        if row.measure not in results:
            continue
        empty = _value(results[row.measure].get("empty"), row)
        full = _value(results[row.measure].get("full"), row)
        ratio = "-"
        if isinstance(empty, int | float) and isinstance(full, int | float) and empty > 0:
            ratio = f"{full / empty:,.2f}"
        lines.append([row.label, _num(empty, row.digits), _num(full, row.digits), ratio])
    return table(["figure", "empty", "full", "full ÷ empty"], lines)


def notes(results: dict[str, dict[str, Figures]]) -> list[str]:
    out = []
    for measure, by_db in results.items():
        for role, figures in by_db.items():
            if "error" in figures:
                out.append(f"- {measure} on {role}: **{figures['error']}**")
            elif figures.get("note"):
                out.append(f"- {measure} on {role}: {figures['note']}")
    lists = results.get("list", {})
    if lists and all("error" not in f for f in lists.values()):
        out.append(
            "- jobs on the list pages: "
            + "; ".join(
                f"{role}: org {f['org']['rows']}, type {f['org_type']['rows']}"
                for role, f in lists.items()
            )
        )
    prune = results.get("prune", {}).get("full")
    if prune and "error" not in prune:
        dropped = prune.get("months_dropped")
        out.append(
            f"- prune: retention {prune['days']} days for every filled type; "
            f"{prune['deleted']:,} jobs deleted, the oldest month held {prune['expected']:,}"
            + (
                f"; months dropped whole: {', '.join(dropped) or 'none'}"
                if dropped is not None
                else ""
            )
            + "; n_dead_tup before → after: "
            + ", ".join(
                f"{k} {prune['dead_before'].get(k, 0):,} → {v:,}"
                for k, v in prune["dead_after"].items()
            )
        )
    return out


# -- running ---------------------------------------------------------------------------


async def measure_all(
    dbs: list[Db], wanted: list[str], run: Run, server: BenchServer
) -> dict[str, dict[str, Figures]]:
    results: dict[str, dict[str, Figures]] = {}
    for measure in wanted:
        fn = MEASURE_FNS[measure]
        for db in dbs:
            if measure == "prune" and db.role != "full":
                continue
            log(f"{measure} on {db.name} ...")
            t = time.perf_counter()
            try:
                with anyio.fail_after(MEASURE_TIMEOUT_S):
                    figures = await fn(db, run, server)
            except Exception as exc:  # a broken measure is a note, not a lost report
                log(f"  {measure} on {db.name} failed: {exc!r}")
                figures = {"error": f"{type(exc).__name__}: {exc}"[:300].replace("\n", " ")}
            log(f"  done in {time.perf_counter() - t:.1f} s")
            results.setdefault(measure, {})[db.role] = figures
    return results


def _sizes_of(args: argparse.Namespace) -> Run:
    quick = args.quick
    return Run(
        jobs=args.jobs if args.jobs is not None else (100_000 if quick else 10_000_000),
        open=args.open if args.open is not None else (1_000 if quick else 10_000),
        drain=args.drain_jobs if args.drain_jobs is not None else (2_000 if quick else 20_000),
        latency=50 if quick else 200,
        reads=args.reads if args.reads is not None else (300 if quick else 2_000),
        lists=50 if quick else 200,
        overviews=30 if quick else 100,
        sweeps=10 if quick else 30,
        vacuum_s=args.vacuum_drain_s if args.vacuum_drain_s is not None else (30 if quick else 300),
        vacuum_rate=args.vacuum_rate,
        slots=args.slots,
    )


def db_names(prefix: str) -> tuple[str, str]:
    """Return the empty and the full database's names, for the schema jobsd has here."""
    version = load_migrations()[-1].version
    return f"{prefix}_empty_v{version}", f"{prefix}_full_v{version}"


async def main_async(
    args: argparse.Namespace, server: BenchServer, info: ServerInfo
) -> tuple[str, Figures]:
    run = _sizes_of(args)
    version = load_migrations()[-1].version
    wanted = [m for m in MEASURES if m in (args.only or MEASURES)]
    measuring = [m for m in wanted if m != "fill"]
    admin = server.admin_url
    t0 = time.perf_counter()
    empty_name, full_name = db_names(args.db_prefix)
    full_url = db_url_for(admin, full_name)
    reused = args.reuse and _exists(admin, full_name)
    if not reused:
        kept = _exists(admin, full_name)
        log(f"{'dropping and creating' if kept else 'creating'} {full_name} ...")
        create_db(admin, full_name)
    try:
        migrate_sync(full_url)
    except MigrationError as exc:
        if not reused:
            raise
        raise SystemExit(f"{full_name} cannot be reused: {exc}; run without --reuse") from None
    full = Db("full", full_name, full_url, await _layout(full_url))
    dbs = [full]
    if measuring:
        log(f"creating {empty_name} ...")
        create_db(admin, empty_name)
        empty_url = db_url_for(admin, empty_name)
        migrate_sync(empty_url)
        dbs.insert(0, Db("empty", empty_name, empty_url, await _layout(empty_url)))
    for db in dbs:
        async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as conn:
            await prepare(db, conn)
    log(f"filling {full_name} ({full.layout} layout, {run.jobs:,} jobs) ...")
    filled = await fill(full, run, args.fill_workers, reused)
    log(
        f"  fill: {filled.jobs_filled:,} jobs in {filled.jobs_s:.1f} s, open jobs"
        f" {filled.open_s:.1f} s, VACUUM ANALYZE {filled.vacuum_s:.1f} s,"
        f" CHECKPOINT {filled.checkpoint_s:.1f} s"
    )
    results = await measure_all(dbs, measuring, run, server)
    took = time.perf_counter() - t0
    data = {
        "postgres": asdict(info),
        "layout": full.layout,
        "schema_version": version,
        "run": asdict(run),
        "fill": {**asdict(filled), "total_s": filled.total_s},
        "results": results,
        "seconds": took,
    }
    return report(args, info, run, full, filled, results, took), data


def report(
    args: argparse.Namespace,
    info: ServerInfo,
    run: Run,
    full: Db,
    filled: FillReport,
    results: dict[str, dict[str, Figures]],
    took_s: float,
) -> str:
    layout = {
        "archive": "hot table + monthly archive (jobsd.jobs_archive)",
        "single": "single table (jobsd.jobs)",
    }[full.layout]
    how = "reused, " if filled.reused else ""
    fill_line = (
        f"- fill ({how}{args.fill_workers} connections): {filled.jobs_filled:,} jobs in "
        f"{filled.jobs_s:.1f} s ({filled.jobs_filled / filled.jobs_s:,.0f}/s), "
        if filled.jobs_filled
        else f"- fill ({how}nothing to fill): "
    ) + (
        f"open jobs {filled.open_s:.1f} s, VACUUM ANALYZE {filled.vacuum_s:.1f} s, "
        f"CHECKPOINT {filled.checkpoint_s:.1f} s; months: {'; '.join(filled.months)}"
    )
    out = [
        f"# jobsd at scale{' (--quick: a smoke run)' if args.quick else ''}",
        "",
        f"- layout: {layout}; {run.jobs:,} finished jobs and {run.open:,} open ones in"
        f" {full.name}, {SEED} seed jobs in both",
        f"- Postgres {info.version}, {info.where}; fsync={info.fsync}, "
        f"synchronous_commit={info.synchronous_commit}",
        f"- machine: {os.cpu_count()} cores ({platform.machine()}), Python "
        f"{platform.python_version()}, psycopg {psycopg.__version__}; whole run {took_s:.0f} s",
        f"- each measure: drain {run.drain:,} jobs, {run.slots} slots; pickup {run.latency}"
        f" jobs; GET {run.reads:,} reads of each kind; {run.lists} pages of each list;"
        f" {run.overviews} overviews; {run.sweeps} sweeps; steady drain {run.vacuum_s:g} s"
        f" at {run.vacuum_rate:,} jobs/s",
        fill_line,
        "",
    ]
    if results:
        out += [report_table(results), ""]
        extra = notes(results)
        if extra:
            out += ["Notes:", "", *extra, ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--database-url", help="server to use (a superuser's URL)")
    parser.add_argument("--jobs", type=int, help="finished jobs to fill (10,000,000)")
    parser.add_argument("--open", type=int, help="open jobs in the full database (10,000)")
    parser.add_argument("--quick", action="store_true", help="100,000 jobs, small measures")
    parser.add_argument("--drain-jobs", type=int, help="jobs in the drain measure (20,000)")
    parser.add_argument("--slots", type=int, default=10, help="daemon slots (10)")
    parser.add_argument("--reads", type=int, help="GET /jobs/{id} reads of each kind (2,000)")
    parser.add_argument(
        "--vacuum-drain-s", type=float, help="length of the steady drain, seconds (300)"
    )
    parser.add_argument(
        "--vacuum-rate", type=int, default=500, help="jobs/s fed during the steady drain (500)"
    )
    parser.add_argument("--only", nargs="+", choices=("fill", *MEASURES), help="run only these")
    parser.add_argument("--keep", action="store_true", help="keep the full database")
    parser.add_argument(
        "--reuse", action="store_true", help="measure on a kept full database (implies --keep)"
    )
    parser.add_argument("--db-prefix", default="scale", help="database names' prefix (scale)")
    parser.add_argument("--fill-workers", type=int, default=2, help="connections filling (2)")
    parser.add_argument("--no-fsync", action="store_true", help="embedded cluster without fsync")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()
    if (args.keep or args.reuse) and not args.database_url:
        parser.error("--keep and --reuse need --database-url (the embedded cluster is removed)")
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,30}", args.db_prefix):
        parser.error("--db-prefix: lower-case letters, digits and _")

    t0 = time.perf_counter()
    log("preparing ..." if args.database_url else "starting Postgres ...")
    server: BenchServer | None = None
    empty_name, full_name = db_names(args.db_prefix)
    kept = args.keep or args.reuse
    try:
        server = BenchServer(args.database_url, fsync=not args.no_fsync)
        info = server.setup()
        text, data = anyio.run(main_async, args, server, info)
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=2, default=str) + "\n")
    finally:
        if server is not None:
            if args.database_url:
                for name in (empty_name,) if kept else (empty_name, full_name):
                    drop_db(server.admin_url, name)
            server.cleanup()
    if kept:
        log(f"kept {full_name}: measure on it again with --reuse")
    log(f"total {time.perf_counter() - t0:.1f} s")
    print(text)


if __name__ == "__main__":
    main()
