"""Claiming one specific job id (PD-21 ST-2): of two claimers, one gets it and the
other gets an explicit AlreadyClaimed, never silence."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import psycopg
import pytest

from jobsd.client import Client
from jobsd.errors import AlreadyClaimed, DatabaseError, JobNotFound
from jobsd.store import queries

pytestmark = [pytest.mark.anyio]


async def test_two_workers_claiming_the_same_job_one_wins_one_is_told(db_url: str) -> None:
    async with Client(db_url) as client:
        job = await client.enqueue("t", {}, org_id="o")
    results: dict[str, Any] = {}

    async def claim(worker: str) -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            try:
                results[worker] = await queries.claim_job(conn, job.id, worker)
            except AlreadyClaimed as exc:
                results[worker] = exc

    async with anyio.create_task_group() as tg:
        for worker in ("w1", "w2"):
            tg.start_soon(claim, worker)

    won = [w for w, r in results.items() if not isinstance(r, Exception)]
    lost = [w for w, r in results.items() if isinstance(r, AlreadyClaimed)]
    assert len(won) == 1 and len(lost) == 1
    claimed = results[won[0]]
    assert claimed.status == "running" and claimed.attempts == 1
    assert claimed.worker_id == won[0] and claimed.lease_id is not None
    assert won[0] in str(results[lost[0]])


async def test_claiming_a_missing_or_finished_job_is_explicit(
    db_url: str, aconn: psycopg.AsyncConnection[Any]
) -> None:
    with pytest.raises(JobNotFound):
        await queries.claim_job(aconn, uuid.uuid4(), "w1")
    async with Client(db_url) as client:
        job = await client.enqueue("t", {}, org_id="o")
    await queries.claim_job(aconn, job.id, "w1")
    await aconn.execute("UPDATE jobsd.jobs SET status = 'succeeded' WHERE id = %s", (job.id,))
    with pytest.raises(DatabaseError, match="succeeded, not queued"):
        await queries.claim_job(aconn, job.id, "w2")
