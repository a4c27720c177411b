"""Bulk enqueue: small batches go in one INSERT, batches of ``BULK_COPY_MIN_JOBS`` or more
through ``COPY`` in one transaction. Both ways store the jobs they return, write one
history row per job, refuse what the other refuses and leave nothing behind when they
do, and return the same jobs when the same batch is sent again."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbcheck import Listener, count_jobs

from jobsd import Client, JobStatus, QueueFull, UnknownQueue
from jobsd.client import JobSpec
from jobsd.errors import PayloadTooLarge
from jobsd.store import enqueue as store_enqueue
from jobsd.store import named
from jobsd.store.enqueue import BULK_COPY_MIN_JOBS

pytestmark = pytest.mark.anyio

# A batch of each way: one INSERT, and COPY.
SIZES = pytest.mark.parametrize("size", [3, BULK_COPY_MIN_JOBS], ids=["insert", "copy"])

# Text that COPY's text format must escape, and text it must not touch.
AWKWARD = 'tab\there, newline\nthere, back\\slash, \\N, \r, é, 😀, "quoted"'


def _events(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT from_status, to_status, attempt, count(*) FROM jobsd.all_job_events "
        "GROUP BY 1, 2, 3 ORDER BY 2"
    ).fetchall()


@SIZES
async def test_a_batch_stores_the_jobs_it_returns(
    size: int, db_url: str, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []

    async def run_and_note(conn: Any, name: str, params: dict[str, Any]) -> Any:
        ran.append(name)
        return await named.run_named_tuples(conn, name, params)

    monkeypatch.setattr(store_enqueue, "run_named_tuples", run_and_note)
    soon = datetime.now(UTC) + timedelta(hours=1)
    past = datetime.now(UTC) - timedelta(hours=1)
    specs = [
        JobSpec.build(
            "t",
            {"i": i, "text": AWKWARD},
            org_id=f"org\t{i % 2}",
            priority=i % 5 - 2,
            concurrency_key=None if i % 3 else f"key {AWKWARD}",
            run_after=(soon, past, None)[i % 3],
        )
        for i in range(size)
    ]
    async with Client(db_url) as client:
        jobs = await client.enqueue_many(specs)
        stored = [await client.get(j.id) for j in jobs]

    assert ran == (["jobs_insert_many"] if size < BULK_COPY_MIN_JOBS else ["jobs_copy_start"])
    assert jobs == stored
    assert [j.id for j in jobs] == [s.id for s in specs]
    assert [j.payload for j in jobs] == [{"i": i, "text": AWKWARD} for i in range(size)]
    assert [j.status for j in jobs] == [
        (JobStatus.SCHEDULED, JobStatus.QUEUED, JobStatus.QUEUED)[i % 3] for i in range(size)
    ]
    assert jobs[0].run_after == soon and jobs[1].run_after == past
    assert jobs[-1].created_at == jobs[0].created_at  # one transaction
    scheduled = len(range(0, size, 3))
    assert _events(conn) == [
        (None, "queued", 0, size - scheduled),
        (None, "scheduled", 0, scheduled),
    ]


@SIZES
async def test_a_batch_sent_again_returns_the_same_jobs(
    size: int, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    specs = [JobSpec.build("t", {"i": i}, org_id="o") for i in range(size)]
    async with Client(db_url) as client:
        first = await client.enqueue_many(specs)
        # as after an answer lost on the way back: the caller sends the same batch
        again = await client.enqueue_many(specs)

    assert again == first
    assert count_jobs(conn) == size
    assert _events(conn) == [(None, "queued", 0, size)]


@SIZES
async def test_a_batch_half_sent_before_completes_and_returns_every_job(
    size: int, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    specs = [JobSpec.build("t", {"i": i}, org_id="o") for i in range(size * 2)]
    async with Client(db_url) as client:
        first_half = await client.enqueue_many(specs[::2])
        every = await client.enqueue_many(specs)

    assert [j.id for j in every] == [s.id for s in specs]
    assert every[::2] == first_half
    assert count_jobs(conn) == size * 2


@SIZES
async def test_a_batch_with_an_unknown_queue_creates_nothing(
    size: int, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    specs = [JobSpec.build("t", {"i": i}, org_id="o") for i in range(size - 1)]
    specs.append(JobSpec.build("t", {}, org_id="o", queue="nope"))
    async with Client(db_url) as client:
        with pytest.raises(UnknownQueue, match="nope"):
            await client.enqueue_many(specs)
    assert count_jobs(conn) == 0
    assert _events(conn) == []


@SIZES
async def test_a_batch_past_a_queues_capacity_creates_nothing(
    size: int, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("INSERT INTO jobsd.queues (name, capacity) VALUES ('small', %s)", (size,))
    specs = [JobSpec.build("t", {"i": i}, org_id="o", queue="small") for i in range(size + 1)]
    async with Client(db_url) as client:
        with pytest.raises(QueueFull):
            await client.enqueue_many(specs)
        assert count_jobs(conn) == 0
        await client.enqueue_many(specs[:size])
    assert count_jobs(conn) == size


@SIZES
async def test_a_payload_over_the_databases_cap_creates_nothing(
    size: int, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    specs = [JobSpec.build("t", {"i": i}, org_id="o") for i in range(size - 1)]
    big = {"blob": "x" * 1_100_000}
    specs.append(JobSpec.build("t", big, org_id="o", max_payload_bytes=2_000_000))
    async with Client(db_url) as client:
        with pytest.raises(PayloadTooLarge, match="1048576"):
            await client.enqueue_many(specs)
    assert count_jobs(conn) == 0


@SIZES
async def test_a_batch_wakes_listeners_once_per_queue(
    size: int,
    db_url: str,
    conn: psycopg.Connection[Any],
    listener: Callable[[], Listener],
) -> None:
    conn.execute("INSERT INTO jobsd.queues (name) VALUES ('mail')")
    watch = listener()
    specs = [
        JobSpec.build("t", {"i": i}, org_id="o", queue="mail" if i % 2 else "default")
        for i in range(size)
    ]
    async with Client(db_url) as client:
        await client.enqueue_many(specs)
    assert sorted(watch.collect(conn)) == ["default", "mail"]
