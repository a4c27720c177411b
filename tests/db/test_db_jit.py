"""No JIT on jobsd's pools. The claim's estimated cost passes Postgres' JIT thresholds
once `jobs` is analyzed with thousands of queued jobs (the lateral count of an org's
running jobs is costed per candidate, though it runs only under an org limit): each
claim then spent 0.75-1 s compiling, and a daemon draining 20,000 jobs took 28-54 s
instead of 4 (found in bench/bench.py's drain at 100 slots)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from support.claims import claim_params

from jobsd import Client
from jobsd.store import connect
from jobsd.store.named import sql_text

pytestmark = pytest.mark.anyio

CLAIM = claim_params(388, types=["noop"], free=100)


def _mid_drain(conn: psycopg.Connection[Any]) -> None:
    """Leave `jobs` as an autovacuum in the middle of a drain sees it, and analyze it:
    thousands queued, thousands running, thousands ended."""
    conn.execute(
        "INSERT INTO jobsd.jobs (org_id, type) SELECT 'o', 'noop' FROM generate_series(1, 20000)"
    )
    conn.execute(
        "UPDATE jobsd.jobs SET status = 'running', started_at = now(), attempts = 1, "
        "lease_id = gen_random_uuid(), worker_id = 'w' "
        "WHERE id IN (SELECT id FROM jobsd.jobs ORDER BY id LIMIT 12000)"
    )
    conn.execute(
        "UPDATE jobsd.jobs SET status = 'succeeded', finished_at = now() "
        "WHERE id IN (SELECT id FROM jobsd.jobs WHERE status = 'running' ORDER BY id LIMIT 6000)"
    )
    conn.execute("ANALYZE jobsd.jobs")


def _jit_available(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT pg_jit_available()").fetchone()
    return bool(row and row[0])


async def _claim_plan(conn: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    cur = await conn.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + sql_text("jobs_claim_batch"), CLAIM
    )
    row = await cur.fetchone()
    assert row is not None
    value = row["QUERY PLAN"] if isinstance(row, dict) else row[0]
    plan: dict[str, Any] = (json.loads(value) if isinstance(value, str) else value)[0]
    return plan


async def test_a_claim_on_an_analyzed_queue_of_thousands_is_not_jit_compiled(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    if not _jit_available(conn):
        pytest.skip("this server has no JIT (no llvmjit)")
    _mid_drain(conn)
    # on a plain session the claim is compiled (what the daemon's claims were)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as plain:
        assert "JIT" in await _claim_plan(plain)

    pool = connect.make_async_pool(
        db_url, name="daemon", min_size=1, max_size=2, timeout_s=5, statement_timeout_s=30
    )
    async with pool, pool.connection() as daemon_conn:
        plan = await _claim_plan(daemon_conn)
    assert "JIT" not in plan
    assert plan["Plan"]["Actual Rows"] == 388
    claimed = conn.execute("SELECT count(*) FROM jobsd.jobs WHERE worker_id = 'w'").fetchone()
    assert claimed == (12000 + 2 * 388,)  # EXPLAIN ANALYZE runs the claim: twice here


async def test_every_pool_of_jobsd_runs_without_jit(db_url: str) -> None:
    pools = [
        connect.make_async_pool(
            db_url, name="daemon", min_size=1, max_size=1, timeout_s=5, statement_timeout_s=30
        ),
        connect.make_async_pool(db_url, name="client", min_size=1, max_size=1, timeout_s=5),
    ]
    for pool in pools:
        async with pool, pool.connection() as c:
            row = await (await c.execute("SHOW jit")).fetchone()
            assert row == {"jit": "off"}, pool.name
    sync_pool = connect.make_sync_pool(db_url, name="sync", min_size=1, max_size=1, timeout_s=5)
    with sync_pool, sync_pool.connection() as c:
        assert c.execute("SHOW jit").fetchone() == {"jit": "off"}
    async with Client(db_url) as client:
        await client._open()
        async with client._pool.connection() as c:
            row = await (await c.execute("SHOW jit")).fetchone()
            assert row == {"jit": "off"}
