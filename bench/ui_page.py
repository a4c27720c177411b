"""Measure how long the dashboard's pages take on the server with a million jobs.

    uv run python bench/ui_page.py [--database-url URL] [--jobs 1000000] [--repeat 30]

A fresh database gets ``--jobs`` jobs in one ``INSERT ... SELECT generate_series``,
created evenly over the last 7 days (UUIDv7 ids of their creation time, as real ones
are): 90 % succeeded, 6 % failed, 2 % cancelled, the rest queued, scheduled or running;
10 orgs, 5 types, 3 queues; the last 5,000 have their history. The API app is called
in-process (httpx's ASGI transport), so a figure is the server's whole work for the
page: the session check, every query and the template, without a network. Each page
is asked ``--repeat`` times after 6 warm-up calls (psycopg prepares a statement after
5 executions: the timed calls use the prepared plans). Prints a markdown table on
stdout; progress on stderr. Without ``--database-url`` a throwaway cluster is started
and removed. Not a test: nothing in tests/ runs it. Target: under 200 ms a page.
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
       'org' || (i % 10), 'type' || (i % 5), (ARRAY['default', 'mail', 'reports'])[i % 3 + 1],
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
            THEN t.at + interval '2 s' END,
       CASE WHEN s.status NOT IN ('queued', 'scheduled') THEN 'bench' END
FROM generate_series(1, {n}) AS i,
LATERAL (SELECT CASE WHEN i > {n} - 2000 AND i % 4 = 0 THEN 'queued'
                     WHEN i > {n} - 2000 AND i % 4 = 1 THEN 'running'
                     WHEN i % 997 = 0 THEN 'scheduled'
                     WHEN i % 50 = 0 THEN 'cancelled'
                     WHEN i % 17 = 0 THEN 'failed'
                     ELSE 'succeeded' END AS status) AS s,
LATERAL (SELECT now() - interval '7 days' + interval '7 days' * i / {n} AS at) AS a,
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


async def measure(url: str, repeat: int) -> list[tuple[str, str, list[float], int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        admin, _ = create_token(conn, OPERATOR, None, "bench", admin=True)
        org, _ = create_token(conn, OPERATOR, "org3", "bench")
        row = conn.execute(
            "SELECT id FROM jobsd.jobs WHERE status = 'failed' ORDER BY created_at DESC LIMIT 1"
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
    ]
    figures = []
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
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    server = BenchServer(args.database_url, fsync=False)
    info = server.setup()

    async def run() -> list[tuple[str, str, list[float], int]]:
        async with server.fresh_database("ui") as url:
            say(f"seeding {args.jobs:,} jobs ...")
            t = time.perf_counter()
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(SEED_SQL.format(n=int(args.jobs)))  # type: ignore[arg-type]
                conn.execute("VACUUM ANALYZE jobsd.jobs")
                conn.execute("VACUUM ANALYZE jobsd.job_events")
                size = conn.execute(
                    "SELECT pg_size_pretty(pg_total_relation_size('jobsd.jobs'))"
                ).fetchone()
            took = time.perf_counter() - t
            say(f"seeded in {took:.0f} s; jobsd.jobs is {size[0] if size else '?'}")
            return await measure(url, args.repeat)

    try:
        figures = anyio.run(run)
    finally:
        server.cleanup()
    print(
        f"\n{args.jobs:,} jobs; Postgres {info.version} ({info.where}); "
        f"{os.cpu_count()} cores; {args.repeat} calls a page after 6 warm-up calls\n"
    )
    print("| token | page | median ms | p95 ms | max ms | bytes |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for who, label, times, size in figures:
        ordered = sorted(times)
        p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
        print(
            f"| {who} | {label} | {statistics.median(times) * 1000:.1f} | {p95 * 1000:.1f} | "
            f"{max(times) * 1000:.1f} | {size:,} |"
        )


if __name__ == "__main__":
    main()
