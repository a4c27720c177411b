"""The claim at scale: 1,000,000 finished jobs and 100,000 queued ones (issue 5, item 8).

    uv run python bench/claim_scale.py [--database-url URL] [--rounds 300] [--explain]

Builds one database: 1,000,000 succeeded jobs, then 100,000 queued ones spread as a
busy application would have them: 50,000 in the `default` queue (priorities 0-3),
40,000 in a paused queue `bulk`, and 10,000 at priority -1 (the head of `default`)
carrying one of 200 concurrency keys, 100 of which are at their limit (a job of each
runs). Rows are written with triggers off (session_replication_role = replica) to
build the data in seconds; the claim runs with everything on. Then it times claim
rounds of 10 jobs, each a real `queries.claim_batch` on the daemon's connection
settings, and prints the EXPLAIN (ANALYZE, BUFFERS) of one round with --explain.
Without --database-url a throwaway cluster is started (fsync on) and removed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import anyio
import psycopg
from server import BenchServer

from jobsd.store import queries
from jobsd.store.sqlfiles import load_queries

FINISHED = 1_000_000
DEFAULT_QUEUED = 50_000
PAUSED_QUEUED = 40_000
KEYED_QUEUED = 10_000
KEYS = 200
BUSY_KEYS = 100
LIMIT = 10


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build(url: str, *, keyed: bool) -> None:
    """Fill the database; triggers off while loading, statistics fresh afterwards.

    Without ``keyed`` the 10,000 keyed jobs are plain jobs of `default` instead.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("INSERT INTO jobsd.queues (name, paused_at) VALUES ('bulk', now())")
        t = time.perf_counter()
        conn.execute(
            "INSERT INTO jobsd.jobs (org_id, type, status, attempts, started_at, finished_at,"
            " created_at) SELECT 'org' || (g %% 50), 't', 'succeeded', 1, now(), now(),"
            " now() - interval '1 day' + g * interval '1 ms'"
            " FROM generate_series(1, %s) AS g",
            (FINISHED,),
        )
        log(f"  {FINISHED:,} finished jobs in {time.perf_counter() - t:.1f} s")
        conn.execute(
            "INSERT INTO jobsd.jobs (org_id, type, priority)"
            " SELECT 'org' || (g %% 50), 't', g %% 4 FROM generate_series(1, %s) AS g",
            (DEFAULT_QUEUED,),
        )
        conn.execute(
            "INSERT INTO jobsd.jobs (org_id, type, queue)"
            " SELECT 'org' || (g %% 50), 't', 'bulk' FROM generate_series(1, %s) AS g",
            (PAUSED_QUEUED,),
        )
        if not keyed:
            conn.execute(
                "INSERT INTO jobsd.jobs (org_id, type, priority)"
                " SELECT 'org1', 'crawl', -1 FROM generate_series(1, %s)",
                (KEYED_QUEUED,),
            )
        conn.execute(
            "INSERT INTO jobsd.jobs (org_id, type, priority, concurrency_key)"
            " SELECT 'org1', 'crawl', -1, 'site:' || (g %% %s) FROM generate_series(1, %s) AS g",
            (KEYS, KEYED_QUEUED if keyed else 0),
        )
        # one running job for each busy key, and the counts that go with it
        conn.execute(
            "INSERT INTO jobsd.jobs (org_id, type, status, attempts, started_at, priority,"
            " concurrency_key, lease_id, worker_id)"
            " SELECT 'org1', 'crawl', 'running', 1, now(), -1, 'site:' || g,"
            " gen_random_uuid(), 'other' FROM generate_series(0, %s) AS g",
            (BUSY_KEYS - 1 if keyed else -1,),
        )
        conn.execute(
            "INSERT INTO jobsd.concurrency_keys (org_id, concurrency_key, running)"
            " SELECT 'org1', 'site:' || g, CASE WHEN g < %s THEN 1 ELSE 0 END"
            " FROM generate_series(0, %s) AS g",
            (BUSY_KEYS, KEYS - 1 if keyed else -1),
        )
        t = time.perf_counter()
        conn.execute("VACUUM (ANALYZE) jobsd.jobs")
        conn.execute("VACUUM (ANALYZE) jobsd.concurrency_keys")
        log(f"  vacuum analyze in {time.perf_counter() - t:.1f} s")


def explain(url: str) -> str:
    """Return the plan of one claim round, executed and rolled back."""
    params: dict[str, Any] = {
        "limit": LIMIT,
        "worker_id": "bench",
        "queues": None,
        "keep_dedup_types": [],
        "limit_types": [],
        "limit_values": [],
        "types": None,
        "free": None,
    }
    text = load_queries()["jobs_claim_batch"]
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY ON) " + text,  # type: ignore[operator]
            params,
        ).fetchall()
        conn.rollback()
    return "\n".join(r[0] for r in rows)


async def time_rounds(url: str, rounds: int) -> list[float]:
    """Time `rounds` claim rounds of LIMIT jobs; claimed jobs are finished, untimed."""
    times: list[float] = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for _ in range(rounds):
            t = time.perf_counter()
            jobs = await queries.claim_batch(
                conn, limit=LIMIT, worker_id="bench", queues=None, keep_dedup_types=[]
            )
            times.append(time.perf_counter() - t)
            assert jobs, "the bench ran out of claimable jobs"
            await conn.execute(
                "UPDATE jobsd.jobs SET status = 'succeeded', finished_at = now()"
                " WHERE id = ANY(%s)",
                ([j.id for j in jobs],),
            )
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--explain", action="store_true")
    args = parser.parse_args()

    server = BenchServer(args.database_url, fsync=True)
    try:
        info = server.setup()
        log(f"Postgres {info.version}, fsync {info.fsync}, {info.where}")

        async def run() -> None:
            print("| case | median | p99 | rounds |\n|---|---|---|---|")
            plans: list[str] = []
            for keyed in (False, True):
                async with server.fresh_database("claim_scale") as url:
                    log(f"building ({'with' if keyed else 'without'} keys) ...")
                    build(url, keyed=keyed)
                    if args.explain:
                        plans.append(explain(url))
                    times = await time_rounds(url, args.rounds)
                ms = sorted(t * 1000 for t in times)
                p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
                what = "10,000 keyed at the head, half their keys busy" if keyed else "no keys"
                print(
                    f"| claim round of {LIMIT}: {FINISHED:,} finished, "
                    f"{DEFAULT_QUEUED + PAUSED_QUEUED + KEYED_QUEUED:,} queued "
                    f"({PAUSED_QUEUED:,} paused), {what} | "
                    f"{statistics.median(ms):.2f} ms | {p99:.2f} ms | {len(ms)} |"
                )
            for plan in plans:
                print("\n```\n" + plan + "\n```")

        anyio.run(run)
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
