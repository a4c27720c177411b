"""Scratch: what the flow-control parts of the claim cost, one job at a time.

    uv run --group bench python bench/experiments/claim_cost.py [--database-url URL]

Round trip (ms, p50 / p90) of ``jobs_claim_batch`` claiming the one queued job, and
of a minimal ``UPDATE ... FOR UPDATE SKIP LOCKED`` claim with the same triggers, each
also on an empty queue; prepared, autocommit, commits not waiting for the disk (as
the daemon's claims).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from common import run_on_scratch
from measure import ORG, TYPE
from psycopg.rows import dict_row

import jobsd
from jobsd.store.named import sql_text

MINIMAL = """
UPDATE jobsd.jobs AS j SET status = 'running', started_at = now(), attempts = j.attempts + 1,
    lease_id = gen_random_uuid(), worker_id = %(worker_id)s
FROM (SELECT id FROM jobsd.jobs WHERE status = 'queued' AND queue = 'default'
      ORDER BY priority, created_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS c
WHERE j.id = c.id RETURNING j.*"""
CLAIM = {
    "limit": 20,
    "worker_id": "bench",
    "queues": None,
    "keep_dedup_types": [],
    "limit_types": [],
    "limit_values": [],
    "free": 10,
    "types": [TYPE],
    "at_most_once_types": [],
    "relaxed_commit": True,
    "reserve_s": 2.0,
}


async def main_async(url: str) -> None:
    statements: dict[str, tuple[Any, dict[str, Any], bool]] = {
        "jobs_claim_batch, one job": (sql_text("jobs_claim_batch"), CLAIM, True),
        "minimal claim, one job": (MINIMAL, {"worker_id": "bench", "limit": 20}, True),
        "jobs_claim_batch, empty queue": (sql_text("jobs_claim_batch"), CLAIM, False),
        "minimal claim, empty queue": (MINIMAL, {"worker_id": "bench", "limit": 20}, False),
    }
    times: dict[str, list[float]] = {k: [] for k in statements}
    async with (
        jobsd.Client(url) as client,
        await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row) as conn,
    ):
        await conn.execute("SET synchronous_commit = off")
        for _ in range(6):
            for name, (text, params, one) in statements.items():
                for i in range(60):
                    if one:
                        await client.enqueue(TYPE, {"i": i}, org_id=ORG)
                    t = time.perf_counter()
                    rows = await (await conn.execute(text, params, prepare=True)).fetchall()
                    if i >= 10:
                        times[name].append((time.perf_counter() - t) * 1e3)
                    assert len(rows) == (1 if one else 0)
                await conn.execute(
                    "UPDATE jobsd.jobs SET status = 'succeeded', finished_at = now() "
                    "WHERE status = 'running'"
                )
    print("| statement | p50 ms | p90 ms |\n|---|---|---|")
    for name, xs in times.items():
        xs.sort()
        print(f"| {name} | {xs[len(xs) // 2]:.3f} | {xs[int(len(xs) * 0.9)]:.3f} |")


if __name__ == "__main__":
    run_on_scratch("claim", main_async)
