"""The cheaper hot path of migration 0010 keeps every guarantee: the history of every
status change (one INSERT per statement now), the start-state check on insert, a
deleted job's events going with it, and the jobs the client builds from its spec
being the jobs stored."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbcheck import count_jobs, history
from support.claims import claim_params
from support.jobs import make_job, make_jobs

from jobsd import Client, Job, JobStatus, UnknownQueue
from jobsd.client import JobSpec
from jobsd.store import named, queries


def _event_count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM jobsd.all_job_events").fetchone()
    assert row is not None
    return int(row[0])


def test_one_update_of_many_jobs_writes_one_event_per_changed_row(
    conn: psycopg.Connection[Any],
) -> None:
    make_jobs(conn, 5)
    keep = make_job(conn, status="running")
    before = _event_count(conn)

    # three of the five change status; the running one is touched without a change
    conn.execute(
        "UPDATE jobsd.jobs SET status = CASE WHEN status = 'queued' THEN 'cancelled' "
        "ELSE status END, reason = 'by hand' "
        "WHERE id IN (SELECT id FROM jobsd.jobs WHERE status = 'queued' ORDER BY id LIMIT 3) "
        "OR id = %s",
        (keep,),
    )

    assert _event_count(conn) == before + 3
    rows = conn.execute(
        "SELECT from_status, to_status, reason "
        "FROM jobsd.all_job_events WHERE to_status = 'cancelled'"
    ).fetchall()
    assert rows == [("queued", "cancelled", "by hand")] * 3
    assert history(conn, keep)[-1][1] == "running"


def test_an_update_that_changes_no_status_writes_no_event(
    conn: psycopg.Connection[Any],
) -> None:
    job = make_job(conn, status="running")
    before = _event_count(conn)
    conn.execute("UPDATE jobsd.jobs SET progress = '{\"updated_at\": 1}' WHERE id = %s", (job,))
    conn.execute("UPDATE jobsd.jobs SET priority = 5")  # every job, no status change
    assert _event_count(conn) == before


def test_an_insert_in_a_state_other_than_a_start_state_is_refused_whole(
    conn: psycopg.Connection[Any],
) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match="a job starts queued"):
        conn.execute(
            "INSERT INTO jobsd.jobs (org_id, type, status) "
            "VALUES ('o', 't', 'queued'), ('o', 't', 'running')"
        )
    assert count_jobs(conn) == 0
    assert _event_count(conn) == 0


def test_deleting_jobs_deletes_their_events_only(conn: psycopg.Connection[Any]) -> None:
    gone = make_job(conn, status="succeeded")
    kept = make_job(conn, status="succeeded")
    kept_events = history(conn, kept)
    assert history(conn, gone)

    conn.execute("DELETE FROM jobsd.jobs WHERE id = %s", (gone,))

    assert history(conn, gone) == []
    assert history(conn, kept) == kept_events


@pytest.mark.anyio
async def test_the_job_an_enqueue_returns_is_the_job_stored(db_url: str) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    async with Client(db_url) as client:
        now = await client.enqueue(
            "t",
            {"b": [1, 2.5, "é"], "a": None},
            org_id="acme",
            priority=-3,
            concurrency_key="k",
            dedup_key="d",
        )
        scheduled = await client.enqueue("t", {}, org_id="acme", run_after=later)
        assert now == await client.get(now.id)
        assert scheduled == await client.get(scheduled.id)
        assert scheduled.status == "scheduled" and scheduled.run_after == later


@pytest.mark.anyio
async def test_a_bulk_enqueue_is_one_statement_and_returns_the_jobs_stored(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    specs = [JobSpec.build("t", {"i": i}, org_id="acme") for i in range(50)]
    async with Client(db_url) as client:
        jobs = await client.enqueue_many(specs)
        assert [j.id for j in jobs] == [s.id for s in specs]
        for job in (jobs[0], jobs[-1]):
            assert job == await client.get(job.id)
    assert count_jobs(conn) == 50
    assert _event_count(conn) == 50


@pytest.mark.anyio
async def test_a_bulk_enqueue_into_an_unknown_queue_inserts_nothing(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    specs = [JobSpec.build("t", {"i": i}, org_id="acme") for i in range(3)]
    specs.append(JobSpec.build("t", {}, org_id="acme", queue="nope"))
    async with Client(db_url) as client:
        with pytest.raises(UnknownQueue, match="nope"):
            await client.enqueue_many(specs)
    assert count_jobs(conn) == 0
    assert _event_count(conn) == 0


@pytest.mark.anyio
async def test_a_bulk_enqueue_with_a_taken_dedup_key_returns_the_holder(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with Client(db_url) as client:
        holder = await client.enqueue("t", {"first": True}, org_id="acme", dedup_key="k")
        specs = [
            JobSpec.build("t", {"i": 1}, org_id="acme"),
            JobSpec.build("t", {"again": True}, org_id="acme", dedup_key="k"),
            JobSpec.build("t", {}, org_id="acme", job_id=uuid.uuid4()),
        ]
        jobs = await client.enqueue_many(specs)
    assert jobs[1] == holder
    assert [j.id for j in jobs[::2]] == [specs[0].id, specs[2].id]
    assert count_jobs(conn) == 3


@pytest.mark.anyio
async def test_a_claimed_job_is_built_from_its_columns_in_field_order(
    db_url: str, aconn: psycopg.AsyncConnection[Any]
) -> None:
    # the claim returns a Job's columns in the order of its fields (Job.from_fields)
    async with Client(db_url) as client:
        enqueued = await client.enqueue(
            "t", {"a": [1, "é"]}, org_id="acme", priority=-2, concurrency_key=None
        )
    rows = await queries.run_named(aconn, "jobs_claim_batch", claim_params(1, free=1))
    # the fields after the 23 columns the claim returns are read elsewhere (a retry's)
    assert list(rows[0])[:23] == [f.name for f in dataclasses.fields(Job)][:23]
    await aconn.execute(
        "UPDATE jobsd.jobs SET status = 'queued', lease_id = NULL, worker_id = NULL WHERE id = %s",
        (enqueued.id,),
    )
    claimed = await queries.claim_batch(
        aconn, limit=5, worker_id="w", queues=None, keep_dedup_types=[], free=5
    )
    assert len(claimed) == 1
    async with Client(db_url) as client:
        assert claimed[0] == await client.get(enqueued.id)
    assert claimed[0].status is JobStatus.RUNNING and claimed[0].priority == -2


@pytest.mark.anyio
async def test_a_written_outcome_is_built_from_its_columns_in_field_order(
    db_url: str, aconn: psycopg.AsyncConnection[Any]
) -> None:
    # the finish returns Finished's fields in their order (built positionally)
    async with Client(db_url) as client:
        enqueued = await client.enqueue("t", {}, org_id="acme", dedup_key="d")
        (claimed,) = await queries.claim_batch(
            aconn, limit=1, worker_id="w", queues=None, keep_dedup_types=["t"], free=1
        )
        assert claimed.lease_id is not None
        outcome = queries.FinishRow(
            claimed.id, claimed.lease_id, "failed", '{"r": 1}', "boom", "by test", {"p": 2}
        )
        written = await queries.finish_batch(aconn, [outcome])
        stored = await client.get(enqueued.id)
    assert list(written) == [enqueued.id]
    assert written[enqueued.id] == queries.Finished(
        stored.id,
        stored.type,
        JobStatus.FAILED,
        stored.concurrency_key,
        stored.dedup_key,
        stored.lease_id,
        "boom",
        "by test",
        stored.progress,
        stored.finished_at,
        stored.run_after,
    )
    assert written[enqueued.id].applied_to(claimed, '{"r": 1}') == stored
    fields = [f.name for f in dataclasses.fields(queries.Finished)]
    # and the order is the statement's, column for column
    assert "RETURNING " + ", ".join(f"j.{f}" for f in fields).replace(
        "j.lease_id, j.error, ", "j.lease_id, j.error,\n          "
    ) in named.sql_text("jobs_finish_batch")
