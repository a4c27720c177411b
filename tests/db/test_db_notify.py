"""enqueue_many, and the wake-up NOTIFY: once per queue and statement or transaction."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbcheck import Listener, count_jobs

from jobsd import Client, JobStatus, SyncClient, UnknownQueue
from jobsd.client import JobSpec
from jobsd.errors import DuplicateJob
from jobsd.store import admin, queries
from jobsd.worker.decide import rescuer, rules_from


def _spec(i: int, **kw: Any) -> JobSpec:
    kw.setdefault("org_id", "o")
    return JobSpec.build("t", {"i": i}, **kw)


@pytest.mark.anyio
async def test_enqueue_many_keeps_order_and_returns_existing_jobs_on_hits(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with Client(db_url) as client:
        existing = await client.enqueue("t", {"old": True}, org_id="o", dedup_key="k3")
        specs = [_spec(i, dedup_key=f"k{i}") for i in range(6)]
        specs.append(_spec(6, dedup_key="k1"))  # same key as an earlier spec of the batch
        jobs = await client.enqueue_many(specs)

    assert [j.payload for j in jobs] == [
        {"i": 0},
        {"i": 1},
        {"i": 2},
        {"old": True},
        {"i": 4},
        {"i": 5},
        {"i": 1},
    ]
    assert jobs[3].id == existing.id
    assert jobs[6].id == jobs[1].id
    assert [j.id for j in jobs if j.id not in (existing.id, jobs[1].id)] == [
        s.id for i, s in enumerate(specs) if i not in (1, 3, 6)
    ]
    assert count_jobs(conn) == 6
    assert conn.execute("SELECT count(*) FROM jobsd.all_job_events").fetchone() == (6,)


@pytest.mark.anyio
async def test_enqueue_many_sent_again_returns_the_same_jobs(
    db_url: str, aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    specs = [_spec(0), _spec(1), _spec(2, dedup_key="k")]
    async with Client(db_url) as client:
        first = await client.enqueue_many(specs)
        # the keyed job starts running (scope 'queue'): its key is free again
        claimed = await queries.claim_batch(
            aconn, limit=10, worker_id="w", queues=None, keep_dedup_types=[]
        )
        assert len(claimed) == 3
        again = await client.enqueue_many(specs)

    assert [j.id for j in again] == [j.id for j in first] == [s.id for s in specs]
    assert [j.status for j in again] == [JobStatus.RUNNING] * 3
    assert count_jobs(conn) == 3


@pytest.mark.anyio
async def test_enqueue_many_is_all_or_nothing(db_url: str, conn: psycopg.Connection[Any]) -> None:
    taken = uuid.uuid4()
    async with Client(db_url) as client:
        await client.enqueue("t", {}, org_id="globex", job_id=taken)
        with pytest.raises(DuplicateJob, match=str(taken)):
            await client.enqueue_many([_spec(0), _spec(1, job_id=taken), _spec(2)])

    assert conn.execute("SELECT org_id FROM jobsd.jobs").fetchall() == [("globex",)]
    assert conn.execute("SELECT count(*) FROM jobsd.all_job_events").fetchone() == (1,)


@pytest.mark.anyio
async def test_enqueue_many_into_an_unknown_queue_creates_nothing(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with Client(db_url) as client:
        with pytest.raises(UnknownQueue, match="nope"):
            await client.enqueue_many([_spec(0), _spec(1, queue="nope")])
    assert count_jobs(conn) == 0


@pytest.mark.anyio
async def test_bulk_insert_sends_one_notification_per_queue(
    db_url: str, conn: psycopg.Connection[Any], listener: Callable[[], Listener]
) -> None:
    conn.execute("INSERT INTO jobsd.queues (name) VALUES ('mail'), ('scheduled-only')")
    watch = listener()
    later = datetime.now(UTC) + timedelta(hours=1)
    specs = [_spec(i, queue="mail" if i % 2 else "default") for i in range(100)]
    specs += [_spec(i, queue="scheduled-only", run_after=later) for i in range(3)]

    async with Client(db_url) as client:
        jobs = await client.enqueue_many(specs)

    # scheduled jobs notify too, so an idle daemon learns their due time
    assert sorted(watch.collect(conn)) == ["default", "mail", "scheduled-only"]
    assert [j.status for j in jobs[-3:]] == [JobStatus.SCHEDULED] * 3
    assert count_jobs(conn) == 103


def test_a_transaction_of_many_inserts_sends_one_notification_per_queue(
    db_url: str, conn: psycopg.Connection[Any], listener: Callable[[], Listener]
) -> None:
    conn.execute("INSERT INTO jobsd.queues (name) VALUES ('mail')")
    watch = listener()
    with SyncClient(db_url) as client, psycopg.connect(db_url) as caller:
        with caller.transaction():
            for i in range(50):
                client.enqueue("t", {"i": i}, org_id="o", conn=caller)
            client.enqueue("t", {}, org_id="o", queue="mail", conn=caller)
            client.enqueue("t", {}, org_id="o", queue="mail", conn=caller)
        assert count_jobs(conn) == 52
        assert sorted(watch.collect(conn)) == ["default", "mail"]

        # each autocommit enqueue is its own transaction: one notification each
        client.enqueue("t", {}, org_id="o")
        client.enqueue("t", {}, org_id="o")
        assert watch.collect(conn) == ["default", "default"]


def test_scheduled_jobs_notify_when_inserted_and_when_promoted(
    db_url: str, conn: psycopg.Connection[Any], listener: Callable[[], Listener]
) -> None:
    watch = listener()
    later = datetime.now(UTC) + timedelta(minutes=5)
    with SyncClient(db_url) as client:
        for _ in range(3):
            client.enqueue("t", {}, org_id="o", run_after=later)
    # an idle daemon must learn the due time: one notification per insert statement
    assert watch.collect(conn) == ["default"] * 3

    promoted = queries.run_named_sync(
        conn, "jobs_promote_due", {"limit": 10, "now": later + timedelta(seconds=1)}
    )

    assert promoted[0]["promoted"] == 3
    assert watch.collect(conn) == ["default"]  # one statement, one transaction


@pytest.mark.anyio
async def test_notifications_off_sends_nothing_but_still_records_history(
    db_url: str,
    aconn: psycopg.AsyncConnection[Any],
    conn: psycopg.Connection[Any],
    listener: Callable[[], Listener],
) -> None:
    watch = listener()
    await admin.set_notify(aconn, False)
    assert await admin.notify_enabled(aconn) is False

    async with Client(db_url) as client:
        await client.enqueue_many([_spec(i) for i in range(10)])
        await client.enqueue("t", {}, org_id="o")
    claimed = await queries.claim_batch(
        aconn, limit=1, worker_id="w", queues=None, keep_dedup_types=[]
    )
    swept = await queries.sweep_stale(
        aconn,
        worker_id="sweeper",
        stale_after_s=1,
        decide=rescuer(rules_from(max_attempts={"t": 2})),
        now=datetime.now(UTC) + timedelta(hours=1),
    )
    assert [j.id for j in swept] == [j.id for j in claimed]
    assert [j.status for j in swept] == [JobStatus.QUEUED]  # requeued, silently

    assert watch.collect(conn) == []
    assert conn.execute("SELECT count(*) FROM jobsd.all_job_events").fetchone() == (13,)

    await admin.set_notify(aconn, True)
    assert await admin.notify_enabled(aconn) is True
    async with Client(db_url) as client:
        await client.enqueue("t", {}, org_id="o")
    assert watch.collect(conn) == ["default"]
