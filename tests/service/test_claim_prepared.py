"""The daemon's connections come with the claim prepared and past its planning.

A connection's first claims would otherwise be planned one by one (psycopg prepares
a statement on its fifth run, Postgres settles on a generic plan after five more),
each taking about twice as long: the first jobs after a start, or after the pool
opens a connection, would start late.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import jobsd
from jobsd.errors import BackendUnavailable
from jobsd.registry import Registry
from jobsd.store import queries
from jobsd.store.db import acquire
from jobsd.worker.supervisor import Daemon

from .conftest import ADb, make_settings, running_daemon, wait_status

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

CLAIM_PLANS = (
    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
    "WHERE statement LIKE 'WITH active AS%%'"
)


async def _claim_plans(conn: psycopg.AsyncConnection[Any]) -> list[tuple[int, int]]:
    cur = await conn.execute(CLAIM_PLANS, prepare=False)
    return [(r["generic_plans"], r["custom_plans"]) for r in await cur.fetchall()]


async def test_every_connection_claims_on_a_generic_plan_from_its_first_claim(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler("touch", registry=registry)
    async def touch(ctx: jobsd.JobContext) -> None:
        return None

    async with running_daemon(make_settings(db_url, slots=2), registry) as daemon:
        # one at a time: each job is its own claim, on whichever connection is free
        for n in range(24):
            job_id = (await client.enqueue("touch", {"n": n}, org_id="acme")).id
            await wait_status(db, job_id, jobsd.JobStatus.SUCCEEDED)
        # every connection of the pool (the pool opens more while all are taken)
        async with AsyncExitStack() as held:
            conns = [
                await held.enter_async_context(acquire(daemon.pool, "test"))
                for _ in range(daemon.pool.max_size)
            ]
            plans = [await _claim_plans(conn) for conn in conns]
    # one prepared claim per connection; its only planned runs are the preparation's
    # first five: every later run, the daemon's claims included, used the generic plan
    # (a claim psycopg did not find prepared would be a second statement on the
    # connection that ran it, from its fifth run: 24 claims over a few connections)
    preparation_plans = queries.CLAIM_PREPARE_RUNS - 1
    assert [len(p) for p in plans] == [1] * len(conns)
    assert [p[0][1] for p in plans] == [preparation_plans] * len(conns)
    assert sum(p[0][0] for p in plans) > len(conns)


async def test_the_preparation_claims_locks_and_writes_nothing(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    job_id = (await client.enqueue("touch", {"n": 1}, org_id="acme")).id
    row = "SELECT to_jsonb(j) AS row FROM jobsd.jobs AS j WHERE id = %s"
    before = await (await db.execute(row, (job_id,))).fetchone()
    async with await psycopg.AsyncConnection.connect(
        db_url, autocommit=True, row_factory=dict_row
    ) as conn:
        await queries.prepare_claim(
            conn, limit=4, free=4, worker_id="w1", queues=None, keep_dedup_types=[]
        )
        assert await _claim_plans(conn) == [(1, queries.CLAIM_PREPARE_RUNS - 1)]
    assert await (await db.execute(row, (job_id,))).fetchone() == before
    stored = await (await db.execute("SELECT count(*) AS n FROM jobsd.job_events")).fetchone()
    assert stored == {"n": 0}
    # and the job is still there for a real claim
    async with await psycopg.AsyncConnection.connect(
        db_url, autocommit=True, row_factory=dict_row
    ) as conn:
        claimed = await queries.claim_batch(
            conn, limit=4, free=4, worker_id="w1", queues=None, keep_dedup_types=[]
        )
    assert [j.id for j in claimed] == [job_id]


async def test_a_refused_preparation_hands_the_connection_out_a_lost_one_does_not(
    db_url: str, db: ADb, registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="jobsd.worker.supervisor")
    daemon = Daemon(make_settings(db_url), registry)
    async with await psycopg.AsyncConnection.connect(
        db_url, autocommit=True, row_factory=dict_row
    ) as conn:
        # a migration holds the queues table: the preparation's claim times out
        await conn.execute("SET statement_timeout = '200ms'")
        async with db.transaction():
            await db.execute("LOCK TABLE jobsd.queues IN ACCESS EXCLUSIVE MODE")
            await daemon._prepare_connection(conn)
        said = [r.getMessage() for r in caplog.records if r.name == "jobsd.worker.supervisor"]
        assert said == ["daemon.claim_not_prepared"]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert await (await conn.execute("SELECT 1 AS one")).fetchone() == {"one": 1}
        await conn.close()
        with pytest.raises(BackendUnavailable):
            await daemon._prepare_connection(conn)
