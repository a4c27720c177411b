"""Measure ``jobsd prune`` on a million terminal jobs: the walk, the deletes, the batches.

    uv run python bench/prune_bench.py [--database-url URL] [--jobs 1000000] [--quick]

A seed database gets ``--jobs`` terminal jobs created evenly over the last 90 days (ids
are UUIDv7 of their creation time, as real ones are), three job_events rows each, and
the queue ``default`` a retention of 30 days: two thirds of the jobs are due. Every
case runs in its own copy of the seed. Without ``--database-url`` a throwaway cluster is
started (fsync on) and removed at the end. Prints a markdown table on stdout; progress
on stderr. bench/README.md says what the columns mean. Not a test: nothing in tests/
runs it.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from server import BenchServer, ServerInfo, db_url_for

import jobsd.store.retention
from jobsd.admin.retention import prune
from jobsd.store.sqlfiles import load_queries

# Bench setup only: triggers off (session_replication_role) for a fast bulk load, then
# the history a real job would have. Ids are built like jobsd.uuidv7() from created_at.
SEED_SQL = """
SET session_replication_role = replica;
INSERT INTO jobsd.jobs (id, org_id, type, queue, status, attempts, payload, report,
                        run_after, created_at, started_at, finished_at, worker_id)
SELECT encode(overlay(uuid_send(gen_random_uuid())
         PLACING int8send(((t.us / 1000) << 16) | x'7000'::int | ((t.us % 1000) * 4096 / 1000))
         FROM 1 FOR 8), 'hex')::uuid,
       'org' || (i % 10), 'type' || (i % 5), 'default',
       CASE WHEN i % 33 = 0 THEN 'cancelled' WHEN i % 14 = 0 THEN 'failed'
            ELSE 'succeeded' END,
       1, jsonb_build_object('i', i), '{"ok": true}',
       t.at, t.at, t.at + interval '1 s', t.at + interval '2 s', 'bench'
FROM generate_series(1, {n}) AS i,
LATERAL (SELECT now() - interval '90 days' + interval '90 days' * i / {n} AS at) AS a,
LATERAL (SELECT a.at, floor(extract(epoch FROM a.at) * 1000000)::bigint AS us) AS t;
INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id, at)
SELECT j.id, j.org_id, e.f, coalesce(e.t, j.status), e.a, 'bench', j.created_at
FROM jobsd.jobs AS j
CROSS JOIN (VALUES (NULL, 'queued', 0), ('queued', 'running', 1), ('running', NULL, 1))
  AS e(f, t, a);
SET session_replication_role = origin;
UPDATE jobsd.queues SET retention_days = 30 WHERE name = 'default';
"""

# The baseline a prune must not be: each batch looks for due jobs with a sequential
# scan from the start of the table (there is no index on finished_at), so batch k
# reads past the dead rows of the k-1 batches before it.
NAIVE_SEARCH_SQL = """
SELECT id FROM jobsd.jobs
WHERE status IN ('succeeded', 'failed', 'cancelled')
  AND finished_at < now() - interval '30 days'
  AND type <> ALL(%(spared)s::text[])
LIMIT %(limit)s
"""
NAIVE_SQL = f"DELETE FROM jobsd.jobs WHERE id IN ({NAIVE_SEARCH_SQL})"
# how often the naive baseline's search is looked at with EXPLAIN (ANALYZE, BUFFERS)
NAIVE_PROBE_EVERY = 10


@dataclass(slots=True)
class Figure:
    """One case: what it deleted (or counted), how long, and what each statement took."""

    case: str
    batch: int
    due: int = 0
    seconds: float = math.nan
    scanned: int = 0
    statements: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    wal_bytes: int = 0
    pg_cpu_s: float | None = None
    note: str = ""


@contextmanager
def timed_statements(figure: Figure) -> Iterator[None]:
    """Time every named statement of a prune (``jobsd.store.retention``'s ``run_named``)."""
    original = jobsd.store.retention.run_named

    async def timing(conn: Any, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        t = time.perf_counter()
        try:
            return await original(conn, name, params)
        finally:
            figure.statements[name].append(time.perf_counter() - t)

    jobsd.store.retention.run_named = timing  # type: ignore[assignment]
    try:
        yield
    finally:
        jobsd.store.retention.run_named = original  # type: ignore[assignment]


CASES = ("dry", "prune", "events", "nolock", "batches", "spared", "naive", "naive-spared")
# the seed has type0..type4 in equal shares; sparing some leaves survivors among old jobs
SPARED = {2: ["type0", "type1"], 4: ["type0", "type1", "type2", "type3"]}

NAIVE_LABEL = "baseline: DELETE ... WHERE id IN (SELECT ... LIMIT n)"

# Other ways to delete a batch, measured against the shipped jobs_prune_delete.
NO_LOCK_SQL = """
WITH gone AS (
  DELETE FROM jobsd.jobs AS j
  WHERE j.id = ANY(%(ids)s::uuid[]) AND j.status IN ('succeeded', 'failed', 'cancelled')
  RETURNING j.queue)
SELECT g.queue, count(*)::bigint AS deleted FROM gone AS g GROUP BY g.queue ORDER BY g.queue
"""


def events_first_sql(shipped: str) -> str:
    """Return the shipped delete with a CTE that deletes the batch's job_events first."""
    changed = shipped.replace(
        "gone AS (",
        "events AS (\n  DELETE FROM jobsd.job_events AS e USING locked AS l"
        " WHERE e.job_id = l.id),\ngone AS (",
        1,
    )
    assert changed != shipped
    return changed


@contextmanager
def delete_statement(text: str | None) -> Iterator[None]:
    """Swap the text of jobs_prune_delete for ``text`` (None: keep the shipped one)."""
    named = load_queries()
    original = named["jobs_prune_delete"]
    if text is not None:
        named["jobs_prune_delete"] = text
    try:
        yield
    finally:
        named["jobs_prune_delete"] = original


class Copies:
    """A seeded database and fresh copies of it, one per case."""

    def __init__(self, server: BenchServer, seed: str) -> None:
        self.server = server
        self.seed = seed
        self.seq = 0
        with psycopg.connect(server.admin_url, autocommit=True) as conn:
            row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
        assert row is not None
        # FILE_COPY: a checkpoint and a file copy, instead of WAL-logging every page
        self.strategy = sql.SQL(" STRATEGY FILE_COPY" if row[0] >= 150000 else "")

    @contextmanager
    def copy(self) -> Iterator[str]:
        self.seq += 1
        name = f"{self.seed}_{self.seq:02d}"
        with psycopg.connect(self.server.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(self.seed)
                )
                + self.strategy
            )
        try:
            yield db_url_for(self.server.admin_url, name)
        finally:
            with psycopg.connect(self.server.admin_url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def seed_database(url: str, n: int) -> None:
    t = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED_SQL.replace("{n}", str(int(n))))
        conn.execute("VACUUM ANALYZE jobsd.jobs")
        conn.execute("VACUUM ANALYZE jobsd.job_events")
        row = conn.execute(
            "SELECT pg_total_relation_size('jobsd.jobs'),"
            " pg_total_relation_size('jobsd.job_events')"
        ).fetchone()
    assert row is not None
    log(
        f"seeded {n:,} jobs in {time.perf_counter() - t:.0f} s: jobs {row[0] / 2**20:,.0f} MiB, "
        f"job_events {row[1] / 2**20:,.0f} MiB"
    )


def wal_lsn(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


async def run_prune(server: BenchServer, url: str, figure: Figure, **kw: Any) -> None:
    """Run one prune on ``url``, filling ``figure``."""
    lsn, pg = wal_lsn(url), server.cpu_s()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        with timed_statements(figure):
            report = await prune(conn, batch_size=figure.batch, **kw)
        # while the backend lives: a backend that exited but is not reaped yet is
        # counted nowhere
        after = server.cpu_s()
    figure.due, figure.seconds, figure.scanned = report.total, report.seconds, report.scanned
    figure.wal_bytes = wal_lsn(url) - lsn
    figure.pg_cpu_s = after - pg if after is not None and pg is not None else None


async def run_naive(
    server: BenchServer, url: str, figure: Figure, cap_s: float, spared: list[str]
) -> None:
    """Delete with the naive statement until nothing is due or ``cap_s`` has passed."""
    lsn, pg = wal_lsn(url), server.cpu_s()
    t0 = time.perf_counter()
    probing_s = 0.0
    probes: list[tuple[int, float, int]] = []  # batch, ms, pages
    params = {"limit": figure.batch, "spared": spared}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while time.perf_counter() - t0 - probing_s < cap_s:
            if len(figure.statements["naive delete"]) % NAIVE_PROBE_EVERY == 0:
                t = time.perf_counter()
                probes.append(await probe_search(conn, params, len(probes) * NAIVE_PROBE_EVERY))
                probing_s += time.perf_counter() - t
            t = time.perf_counter()
            cur = await conn.execute(NAIVE_SQL, params)
            figure.statements["naive delete"].append(time.perf_counter() - t)
            figure.due += cur.rowcount
            if cur.rowcount < figure.batch:
                break
        else:
            figure.note = f"stopped after {cap_s:.0f} s; "
        figure.seconds = time.perf_counter() - t0 - probing_s
        after = server.cpu_s()
        # a second run at once: nothing is due, and the search reads until the end
        t = time.perf_counter()
        await conn.execute(NAIVE_SQL, params)
        again_ms = (time.perf_counter() - t) * 1000
    figure.wal_bytes = wal_lsn(url) - lsn
    figure.pg_cpu_s = after - pg if after is not None and pg is not None else None
    (b0, ms0, pages0), (b1, ms1, pages1) = probes[0], probes[-1]
    figure.note += (
        f"search of batch {b0 + 1}: {ms0:,.0f} ms, {pages0:,} pages; "
        f"of batch {b1 + 1}: {ms1:,.0f} ms, {pages1:,} pages; "
        f"run again at once (nothing due): {again_ms:,.0f} ms"
    )


async def probe_search(
    conn: psycopg.AsyncConnection[Any], params: dict[str, Any], batch: int
) -> tuple[int, float, int]:
    """Return the naive search's time and pages read (EXPLAIN ANALYZE), without deleting."""
    cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + NAIVE_SEARCH_SQL, params)
    row = await cur.fetchone()
    assert row is not None
    plan = row[0][0]
    pages = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
    return batch, float(plan["Execution Time"]), int(pages)


async def run_cases(args: argparse.Namespace, server: BenchServer, copies: Copies) -> list[Figure]:
    """Run the chosen cases ``--repeat`` times; return the median run of each row."""
    runs: dict[tuple[str, int], list[Figure]] = defaultdict(list)
    for i in range(args.repeat):
        if args.repeat > 1:
            log(f"-- round {i + 1} of {args.repeat}")
        for figure in await run_round(args, server, copies):
            runs[(figure.case, figure.batch)].append(figure)
    return [_median(figures) for figures in runs.values()]


def _median(figures: list[Figure]) -> Figure:
    if len(figures) == 1:
        return figures[0]
    ordered = sorted(figures, key=lambda f: f.seconds)
    mid = ordered[(len(ordered) - 1) // 2]
    spread = f"median of {len(figures)}: {ordered[0].seconds:.1f}-{ordered[-1].seconds:.1f} s"
    mid.note = f"{spread}; {mid.note}" if mid.note else spread
    return mid


async def run_round(args: argparse.Namespace, server: BenchServer, copies: Copies) -> list[Figure]:
    figures: list[Figure] = []
    b = args.batch_size

    async def naive(label: str, spared: list[str]) -> None:
        with copies.copy() as url:
            log(f"{label} ...")
            figure = Figure(label, b)
            await run_naive(server, url, figure, args.naive_cap, spared)
            figures.append(figure)
            log(f"  {figure.due:,} in {figure.seconds:.1f} s")

    async def case(url: str, label: str, batch: int, **kw: Any) -> Figure:
        log(f"{label} ...")
        figure = Figure(label, batch)
        await run_prune(server, url, figure, **kw)
        figures.append(figure)
        log(f"  {figure.due:,} in {figure.seconds:.1f} s")
        return figure

    wanted = set(args.only or CASES)
    if "dry" in wanted:
        with copies.copy() as url:
            await case(url, "dry run (counts, deletes nothing)", b, dry_run=True)
    if "prune" in wanted:
        with copies.copy() as url:
            await case(url, "prune", b)
            await case(url, "prune again at once (dead rows not yet vacuumed)", b)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM jobsd.jobs")
            await case(url, "prune again after VACUUM", b)
    variants = {
        "events": ("prune, job_events deleted first (not shipped)", events_first_sql),
        "nolock": ("prune, DELETE without FOR UPDATE SKIP LOCKED (not shipped)", None),
    }
    for key, (label, make) in variants.items():
        if key in wanted:
            text = make(load_queries()["jobs_prune_delete"]) if make else NO_LOCK_SQL
            with copies.copy() as url, delete_statement(text):
                await case(url, label, b)
    if "batches" in wanted:
        for other in args.other_batches:
            with copies.copy() as url:
                await case(url, "prune", other)
    for n, types in SPARED.items():
        spared = f"{n} of 5 types spared ({n * 20} % of old jobs read and kept)"
        if "spared" in wanted:
            with copies.copy() as url:
                await case(url, f"prune, {spared}", b, spare_types=types)
        if "naive-spared" in wanted:
            await naive(f"{NAIVE_LABEL}, {spared}", types)
    if "naive" in wanted:
        await naive(NAIVE_LABEL, [])
    return figures


def ms(xs: list[float], q: float) -> str:
    if not xs:
        return "-"
    ordered = sorted(xs)
    return f"{ordered[max(math.ceil(q * len(ordered)) - 1, 0)] * 1000:,.0f}"


# per-job figures of a case that deleted fewer jobs mean nothing
PER_JOB_MIN = 1000


def trend(xs: list[float], n: int = 10) -> str:
    """Return the mean of the first and of the last ``n`` values, in ms."""
    if len(xs) < 2 * n:
        return "-"
    return f"{sum(xs[:n]) / n * 1000:,.0f} → {sum(xs[-n:]) / n * 1000:,.0f}"


def report(args: argparse.Namespace, info: ServerInfo, figures: list[Figure]) -> str:
    head = [
        "case",
        "batch",
        "jobs",
        "s",
        "jobs/s",
        "rows read",
        "scans",
        "scan ms p50/max",
        "deletes",
        "delete txn ms p50/p99/max",
        "delete ms, first 10 → last 10",
        "WAL B/job",
        "µs Postgres CPU/job",
        "note",
    ]
    rows = []
    for f in figures:
        scans = f.statements.get("jobs_prune_scan", [])
        deletes = f.statements.get("jobs_prune_delete", []) or f.statements.get("naive delete", [])
        per_job = max(f.due, 1)
        rate = f"**{f.due / f.seconds:,.0f}**" if f.due >= PER_JOB_MIN and f.seconds > 0 else "-"
        rows.append(
            [
                f.case,
                f"{f.batch:,}",
                f"{f.due:,}",
                f"{f.seconds:.1f}",
                rate,
                f"{f.scanned:,}" if scans else "-",
                f"{len(scans):,}" if scans else "-",
                f"{ms(scans, 0.5)} / {ms(scans, 1.0)}" if scans else "-",
                f"{len(deletes):,}",
                f"{ms(deletes, 0.5)} / {ms(deletes, 0.99)} / {ms(deletes, 1.0)}",
                trend(deletes),
                f"{f.wal_bytes / per_job:,.0f}" if f.due >= PER_JOB_MIN else "-",
                f"{f.pg_cpu_s / per_job * 1e6:,.0f}"
                if f.pg_cpu_s is not None and f.due >= PER_JOB_MIN
                else "-",
                f.note,
            ]
        )
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(
        [
            f"# jobsd prune bench: {args.jobs:,} terminal jobs, 3 job_events each, "
            "created over 90 days, retention 30 days",
            "",
            f"- Postgres {info.version}, {info.where}; fsync={info.fsync}, "
            f"synchronous_commit={info.synchronous_commit}",
            f"- machine: {os.cpu_count()} cores ({platform.machine()}), Python "
            f"{platform.python_version()}; each case on a fresh copy of the seed database",
            "",
            *lines,
        ]
    )


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--database-url", help="server to use (needs CREATE DATABASE)")
    parser.add_argument("--jobs", type=int, default=1_000_000, help="terminal jobs (1,000,000)")
    parser.add_argument("--batch-size", type=int, default=5000, help="the main cases' batch")
    parser.add_argument(
        "--other-batches",
        type=int,
        nargs="*",
        default=[1000, 20000],
        help="batch sizes of extra prune cases (1000 20000)",
    )
    parser.add_argument("--quick", action="store_true", help="20,000 jobs: a smoke run")
    parser.add_argument("--only", nargs="+", choices=CASES, help="run only these cases")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; the median is shown (1)")
    parser.add_argument(
        "--naive-cap",
        type=float,
        default=300.0,
        help="stop the naive baseline after this many seconds (300)",
    )
    parser.add_argument("--no-fsync", action="store_true", help="embedded cluster without fsync")
    args = parser.parse_args()
    if args.quick:
        args.jobs = 20_000
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    t0 = time.perf_counter()
    server = BenchServer(args.database_url, fsync=not args.no_fsync)
    try:
        info = server.setup()

        async def go() -> list[Figure]:
            async with server.fresh_database("prune_seed") as seed_url:
                seed_database(seed_url, args.jobs)
                seed = conninfo_to_dict(seed_url)["dbname"]
                assert isinstance(seed, str)
                return await run_cases(args, server, Copies(server, seed))

        figures = anyio.run(go)
    finally:
        server.cleanup()
    log(f"total {time.perf_counter() - t0:.0f} s")
    print(report(args, info, figures))


if __name__ == "__main__":
    main()
