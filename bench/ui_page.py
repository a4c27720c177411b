"""Measure how long the dashboard's pages take on the server with a million jobs.

    uv run python bench/ui_page.py [--database-url URL] [--jobs 1000000] [--days 7]
                                   [--repeat 50]

A fresh database gets ``--jobs`` jobs in one ``INSERT ... SELECT generate_series``,
created evenly over the last ``--days`` days (UUIDv7 ids of their creation time, as
real ones are): 90 % succeeded, 6 % failed, 2 % cancelled, the rest queued, scheduled
or running; 10 orgs, 5 types (each with its own run times, spread over a factor of
ten), 3 queues; the last 5,000 have their history. Then the ended ones move into the
archive as the daemons move them (``jobsd.archive_move``, batches of 50,000, those that
ended more than 10 s ago), which fills the per-type rollup ``jobsd.type_stats``.

The per-type figures (``jobsd.ops.type_stats``: the statements of /ui/types) are timed
on one connection, then the pages through the API app in-process (httpx's ASGI
transport), logged in, so a page's figure is the server's whole work for it: the
session check, every query and the template, without a network. Each is asked
``--repeat`` times after 6 warm-up calls (psycopg prepares a statement after 5
executions: the timed calls use the prepared plans). Prints markdown tables on stdout;
progress on stderr. Without ``--database-url`` a throwaway cluster is started and
removed. Not a test: nothing in tests/ runs it. Targets: under 200 ms a page, under
100 ms for the per-type pages.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import anyio
import httpx
import psycopg
from server import BenchServer

from jobsd.http.app import create_app
from jobsd.http.settings import HttpSettings
from jobsd.ops import Caller
from jobsd.ops.tokens import create_token
from jobsd.ops.type_stats import read_type_stats
from jobsd.settings import Settings

OPERATOR = Caller.as_operator("tests")

SEED_SQL = """
SET session_replication_role = replica;
INSERT INTO jobsd.queues (name) VALUES ('mail'), ('reports') ON CONFLICT DO NOTHING;
INSERT INTO jobsd.jobs (id, org_id, type, queue, status, attempts, payload, progress,
                        report, error, reason, run_after, created_at, started_at,
                        finished_at, worker_id)
SELECT encode(overlay(uuid_send(gen_random_uuid())
         PLACING int8send(((t.us / 1000) << 16) | x'7000'::int | ((t.us % 1000) * 4096 / 1000))
         FROM 1 FOR 8), 'hex')::uuid,
       'org' || (i % 10), 'type' || (i / 10 % 5), (ARRAY['default', 'mail', 'reports'])[i % 3 + 1],
       s.status, CASE WHEN s.status IN ('queued', 'scheduled') THEN 0 ELSE 1 END,
       jsonb_build_object('i', i, 'file', 'customers-' || i || '.csv'),
       CASE WHEN s.status = 'running' THEN jsonb_build_object('done', i % 100, 'total', 100) END,
       CASE WHEN s.status = 'succeeded' THEN jsonb_build_object('ok', true) END,
       CASE WHEN s.status = 'failed' THEN 'RuntimeError: row ' || i || ' is malformed' END,
       CASE WHEN s.status = 'failed' THEN 'max attempts exceeded' END,
       CASE WHEN s.status = 'scheduled' THEN now() + interval '1 hour' ELSE t.at END,
       t.at,
       CASE WHEN s.status NOT IN ('queued', 'scheduled') THEN t.at + interval '1 s' END,
       CASE WHEN s.status IN ('succeeded', 'failed', 'cancelled')
            THEN t.at + interval '1 s' + interval '1 ms'
                 * (ARRAY[10, 100, 1000, 10000, 300])[i / 10 % 5 + 1]
                 * power(10, (i::bigint * 7919 % 1000) / 1000.0) END,
       CASE WHEN s.status NOT IN ('queued', 'scheduled') THEN 'bench' END
FROM generate_series(1, {n}) AS i,
LATERAL (SELECT CASE WHEN i > {n} - 2000 AND i % 4 = 0 THEN 'queued'
                     WHEN i > {n} - 2000 AND i % 4 = 1 THEN 'running'
                     WHEN i % 997 = 0 THEN 'scheduled'
                     WHEN i % 50 = 0 THEN 'cancelled'
                     WHEN i % 17 = 0 THEN 'failed'
                     ELSE 'succeeded' END AS status) AS s,
LATERAL (SELECT now() - interval '{days} days' - interval '3 min'
                + interval '{days} days' * i / {n} AS at) AS a,
LATERAL (SELECT a.at, floor(extract(epoch FROM a.at) * 1000000)::bigint AS us) AS t;
INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id, at)
SELECT j.id, j.org_id, e.f, coalesce(e.t, j.status), e.a, 'bench', j.created_at
FROM (SELECT * FROM jobsd.jobs ORDER BY created_at DESC LIMIT 5000) AS j
CROSS JOIN (VALUES (NULL, 'queued', 0), ('queued', 'running', 1), ('running', NULL, 1))
  AS e(f, t, a)
WHERE j.status IN ('succeeded', 'failed', 'cancelled');
SET session_replication_role = origin;
"""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


Figures = list[tuple[str, str, list[float], int]]


async def measure_queries(url: str, repeat: int) -> Figures:
    """Time the per-type figures' reads (``read_type_stats``: the statement of a
    types page) on one connection, as the pages run them."""
    reads = [
        ("admin", "every type", OPERATOR, {}),
        ("admin", "every type, one org", OPERATOR, {"org_id": "org7"}),
        ("admin", "one type", OPERATOR, {"type": "type2"}),
        ("org", "every type", Caller.for_org("org3", "bench"), {}),
        ("org", "one type", Caller.for_org("org3", "bench"), {"type": "type2"}),
    ]
    figures: Figures = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for who, label, caller, options in reads:
            for _ in range(6):
                found = await read_type_stats(conn, caller, **options)
                assert found, (label, "no figures")
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                found = await read_type_stats(conn, caller, **options)
                times.append(time.perf_counter() - t)
            figures.append((who, label, times, len(found)))
            say(f"{who:5} {label:24} median {statistics.median(times) * 1000:7.1f} ms")
    return figures


async def measure(url: str, repeat: int) -> Figures:
    with psycopg.connect(url, autocommit=True) as conn:
        admin, _ = create_token(conn, OPERATOR, None, "bench", admin=True)
        org, _ = create_token(conn, OPERATOR, "org3", "bench")
        row = conn.execute(
            "SELECT id FROM jobsd.all_jobs WHERE status = 'failed' ORDER BY created_at DESC LIMIT 1"
        ).fetchone()
        assert row is not None
        failed_id = row[0]
    app = create_app(Settings(database_url=url), HttpSettings())
    pages = [
        ("admin", "overview", "/ui"),
        ("admin", "jobs, first page", "/ui/jobs"),
        ("admin", "jobs, state failed", "/ui/jobs?status=failed"),
        ("admin", "jobs, org + type", "/ui/jobs?org=org7&type=type2"),
        ("admin", "jobs, a day ago", "/ui/jobs?until=" + _day_ago()),
        ("admin", "jobs, queued in mail", "/ui/jobs?status=queued&queue=mail"),
        ("admin", "one job", f"/ui/jobs/{failed_id}"),
        ("org", "overview", "/ui"),
        ("org", "jobs, first page", "/ui/jobs"),
        ("org", "jobs, state failed", "/ui/jobs?status=failed"),
        ("admin", "job types", "/ui/types"),
        ("admin", "job types, one org", "/ui/types?org=org7"),
        ("admin", "one type", "/ui/types/type2"),
        ("org", "job types", "/ui/types"),
        ("org", "one type", "/ui/types/type2"),
    ]
    figures: Figures = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        clients = {}
        for who, token in (("admin", admin), ("org", org)):
            client = httpx.AsyncClient(transport=transport, base_url="http://bench")
            answer = await client.post("/ui/login", data={"token": token})
            assert answer.status_code == 303, answer.text
            clients[who] = client
        for who, label, path in pages:
            client = clients[who]
            for _ in range(6):
                warm = await client.get(path)
                assert warm.status_code == 200, (path, warm.status_code, warm.text[:300])
            times = []
            size = 0
            for _ in range(repeat):
                t = time.perf_counter()
                answer = await client.get(path)
                times.append(time.perf_counter() - t)
                assert answer.status_code == 200
                size = len(answer.content)
            figures.append((who, label, times, size))
            say(f"{who:5} {label:24} median {statistics.median(times) * 1000:7.1f} ms")
        for client in clients.values():
            await client.aclose()
    return figures


def _day_ago() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 86400))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=7, help="created over this many days")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    server = BenchServer(args.database_url, fsync=False)
    info = server.setup()

    async def run() -> tuple[Figures, Figures]:
        async with server.fresh_database("ui") as url:
            say(f"seeding {args.jobs:,} jobs over {args.days} days ...")
            t = time.perf_counter()
            with psycopg.connect(url, autocommit=True) as conn:
                seed = SEED_SQL.format(n=int(args.jobs), days=int(args.days))
                conn.execute(seed)  # type: ignore[arg-type]
                took = time.perf_counter() - t
                say(f"seeded in {took:.0f} s; moving the ended jobs into the archive ...")
                t = time.perf_counter()
                moved = 0
                while True:
                    row = conn.execute("SELECT jobsd.archive_move(50000, 10)").fetchone()
                    moved += row[0] if row else 0
                    if not row or row[0] < 50000:
                        break
                took = time.perf_counter() - t
                say(f"moved {moved:,} in {took:.0f} s ({moved / max(took, 1e-9):,.0f} jobs/s)")
                for table in ("jobs", "job_events", "jobs_archive", "type_stats"):
                    conn.execute(f"VACUUM ANALYZE jobsd.{table}")  # type: ignore[arg-type]
                sizes = conn.execute(
                    "SELECT (SELECT count(*) FROM jobsd.jobs), "
                    "(SELECT pg_size_pretty(sum(pg_total_relation_size(i.inhrelid))) "
                    "FROM pg_inherits AS i WHERE i.inhparent = 'jobsd.jobs_archive'::regclass), "
                    "(SELECT count(*) FROM jobsd.type_stats), "
                    "pg_size_pretty(pg_total_relation_size('jobsd.type_stats'))"
                ).fetchone()
            assert sizes is not None
            say(
                f"hot table: {sizes[0]:,} jobs; archive {sizes[1]}; "
                f"type_stats: {sizes[2]:,} rows, {sizes[3]}"
            )
            return await measure_queries(url, args.repeat), await measure(url, args.repeat)

    try:
        queries, pages = anyio.run(run)
    finally:
        server.cleanup()
    print(
        f"\n{args.jobs:,} jobs over {args.days} days, ended ones archived; Postgres "
        f"{info.version} ({info.where}); {os.cpu_count()} cores; {args.repeat} calls "
        "each after 6 warm-up calls\n"
    )
    for title, figures, last in (
        ("per-type figures (read_type_stats, one connection)", queries, "types"),
        ("pages (the API app in-process, logged in)", pages, "bytes"),
    ):
        print(f"{title}:\n")
        print(
            f"| token | {'read' if last == 'types' else 'page'} | median ms | p95 ms | max ms "
            f"| {last} |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        for who, label, times, size in figures:
            ordered = sorted(times)
            p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
            print(
                f"| {who} | {label} | {statistics.median(times) * 1000:.1f} | "
                f"{p95 * 1000:.1f} | {max(times) * 1000:.1f} | {size:,} |"
            )
        print()


if __name__ == "__main__":
    main()
