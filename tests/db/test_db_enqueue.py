"""Enqueue on jobsd's own pool (async and sync) and inside a caller's psycopg transaction."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbcheck import count_jobs, history, job_row
from support.claims import claim_params

from jobsd import Client, JobStatus, SyncClient
from jobsd.store import queries


@pytest.fixture
def sync_client(db_url: str) -> Iterator[SyncClient]:
    with SyncClient(db_url) as client:
        yield client


def _assert_stored(conn: psycopg.Connection[Any], job: Any, status: str = "queued") -> None:
    row = job_row(conn, job.id)
    assert row is not None
    assert row["status"] == status == job.status
    assert (row["org_id"], row["type"], row["queue"]) == (job.org_id, job.type, job.queue)
    assert row["payload"] == job.payload
    assert row["attempts"] == 0
    assert history(conn, job.id) == [(None, status, 0, None, None)]


@pytest.mark.anyio
async def test_async_client_enqueue_returns_the_committed_job(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with Client(db_url) as client:
        job = await client.enqueue(
            "import_csv", {"file": "a.csv", "n": 3}, org_id="acme", dedup_key="a.csv"
        )
        assert (await client.get(job.id, org_id="acme")) == job
        events = await client.events(job.id)

    assert job.id.version == 7
    assert job.status is JobStatus.QUEUED
    assert job.dedup_key == "a.csv"
    assert job.payload == {"file": "a.csv", "n": 3}
    _assert_stored(conn, job)
    assert [(e.from_status, e.to_status, e.attempt) for e in events] == [(None, "queued", 0)]


def test_sync_client_enqueue_returns_the_committed_job(
    sync_client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    job = sync_client.enqueue("map_reconcile", {"map": 7}, org_id="acme")

    assert job.status is JobStatus.QUEUED
    assert sync_client.get(job.id) == job
    assert [e.to_status for e in sync_client.events(job.id)] == ["queued"]
    _assert_stored(conn, job)


def test_future_run_after_gives_scheduled(
    sync_client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    job = sync_client.enqueue("t", {}, org_id="o", run_after=later)
    past = sync_client.enqueue("t", {}, org_id="o", run_after=datetime.now(UTC) - timedelta(1))

    assert job.status is JobStatus.SCHEDULED
    assert job.run_after == later
    _assert_stored(conn, job, status="scheduled")
    assert past.status is JobStatus.QUEUED


def test_in_caller_transaction_rolled_back_leaves_no_job(
    db_url: str, sync_client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(db_url) as caller:
        job = sync_client.enqueue("t", {"x": 1}, org_id="o", conn=caller)
        # visible inside the transaction, not outside it
        assert job_row(caller, job.id) is not None
        assert job_row(conn, job.id) is None
        caller.rollback()

    assert job_row(conn, job.id) is None
    assert conn.execute("SELECT count(*) FROM jobsd.all_job_events").fetchone() == (0,)


def test_in_caller_transaction_committed_creates_the_job_with_the_app_rows(
    db_url: str, sync_client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY, job_id uuid)")
    with psycopg.connect(db_url) as caller:
        with caller.transaction():
            job = sync_client.enqueue("t", {"order": 1}, org_id="o", conn=caller)
            caller.execute("INSERT INTO orders VALUES (1, %s)", (job.id,))
            assert job_row(conn, job.id) is None
        assert caller.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    _assert_stored(conn, job)
    assert conn.execute("SELECT job_id FROM orders").fetchone() == (job.id,)


def test_jobs_enqueued_in_one_transaction_are_claimed_in_enqueue_order(
    db_url: str, sync_client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(db_url) as caller, caller.transaction():
        made = [sync_client.enqueue("t", {"i": i}, org_id="o", conn=caller) for i in range(40)]
    rows = conn.execute("SELECT DISTINCT created_at FROM jobsd.jobs").fetchall()
    assert len(rows) == 1  # same transaction, same created_at: the id decides

    claimed = queries.run_named_sync(
        conn,
        "jobs_claim_batch",
        claim_params(100),
    )
    claimed.sort(key=lambda r: (r["created_at"], r["id"]))
    assert [r["payload"]["i"] for r in claimed] == list(range(40))
    assert [r["id"] for r in claimed] == [j.id for j in made]


@pytest.mark.anyio
async def test_in_caller_async_transaction(db_url: str, conn: psycopg.Connection[Any]) -> None:
    async with Client(db_url) as client, await psycopg.AsyncConnection.connect(db_url) as caller:
        async with caller.transaction():
            kept = await client.enqueue("t", {}, org_id="o", conn=caller)
        dropped = await client.enqueue("t", {}, org_id="o", conn=caller)
        await caller.rollback()

    _assert_stored(conn, kept)
    assert job_row(conn, dropped.id) is None
    assert count_jobs(conn) == 1


def test_job_id_given_by_the_client_is_used(
    sync_client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    wanted = uuid.uuid4()
    job = sync_client.enqueue("t", {}, org_id="o", job_id=str(wanted))
    assert job.id == wanted
    _assert_stored(conn, job)
