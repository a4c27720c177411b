"""History written once (migration 0032): a drained job stores no history row, and its
whole history, read through jobsd.all_job_events, is the same as when every transition
was a row: gapless, in order, with who, when, from, to, attempt and reason. The events
a job's row stands for (its creation, its current run's start and end) and the stored
ones interleave in the order they happened, through retries, rescues, notes and the
archive; a path that does not stamp its transition stores it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbcheck import claim_one, history, insert_job

from jobsd.models import Job
from jobsd.store import queries
from jobsd.store.queries import FinishRow
from jobsd.worker.decide import rescuer, rules_from

pytestmark = pytest.mark.anyio

AConn = psycopg.AsyncConnection[Any]
Conn = psycopg.Connection[Any]


async def finish(aconn: AConn, run: Job, status: str, reason: str | None = None) -> None:
    assert run.lease_id is not None
    row = FinishRow(
        run.id,
        run.lease_id,
        status,
        None,
        None,
        reason,
        None,
        delay_s=0.0 if status == "scheduled" else None,
    )
    assert run.id in await queries.finish_batch(aconn, [row])


def stored(conn: Conn, job_id: uuid.UUID) -> int:
    row = conn.execute(
        "SELECT count(*) FROM jobsd.job_events WHERE job_id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def times(conn: Conn, job_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT e.at, j.created_at, j.started_at, j.finished_at FROM jobsd.all_job_events AS e"
        " JOIN jobsd.all_jobs AS j ON j.id = e.job_id WHERE e.job_id = %s ORDER BY e.id",
        (job_id,),
    ).fetchall()


async def test_a_drained_job_stores_no_history_row_and_reads_whole(
    aconn: AConn, conn: Conn
) -> None:
    job_id = await insert_job(aconn)
    run = await claim_one(aconn)
    await finish(aconn, run, "succeeded", "done")

    assert stored(conn, job_id) == 0
    assert history(conn, job_id) == [
        (None, "queued", 0, None, None),
        ("queued", "running", 1, "w1", None),
        ("running", "succeeded", 1, "w1", "done"),
    ]
    ((created_at, c, _, _), (started_at, _, s, _), (finished_at, _, _, f)) = times(conn, job_id)
    assert (created_at, started_at, finished_at) == (c, s, f)
    assert created_at <= started_at <= finished_at


async def test_a_retried_run_is_stored_when_it_ends_and_the_next_one_is_derived(
    aconn: AConn, conn: Conn
) -> None:
    job_id = await insert_job(aconn)
    first = await claim_one(aconn)
    await finish(aconn, first, "scheduled", "retry")
    assert stored(conn, job_id) == 2  # the first run's start, under its own id, and its end
    await aconn.execute(
        "UPDATE jobsd.jobs SET status = 'queued', reason = 'due' WHERE id = %s", (job_id,)
    )
    second = await claim_one(aconn, "w2")
    await finish(aconn, second, "failed", "handler error")

    assert stored(conn, job_id) == 3
    assert history(conn, job_id) == [
        (None, "queued", 0, None, None),
        ("queued", "running", 1, "w1", None),
        ("running", "scheduled", 1, "w1", "retry"),
        ("scheduled", "queued", 1, "w1", "due"),
        ("queued", "running", 2, "w2", None),
        ("running", "failed", 2, "w2", "handler error"),
    ]


async def test_notes_fall_where_they_happened_between_derived_events(
    aconn: AConn, conn: Conn, db_url: str
) -> None:
    job_id = await insert_job(aconn)
    run = await claim_one(aconn)
    # a cancel request while it runs (the trigger's note), then the end, then a late
    # result of another worker discarded
    await aconn.execute("SELECT set_config('jobsd.actor', 'ops', false)")
    await aconn.execute(
        "UPDATE jobsd.jobs SET cancel_requested_at = now() WHERE id = %s", (job_id,)
    )
    await aconn.execute("SELECT set_config('jobsd.actor', '', false)")
    await finish(aconn, run, "cancelled", "cancelled by ops")
    await queries.note_discarded(aconn, [job_id], worker_id="late")

    assert history(conn, job_id) == [
        (None, "queued", 0, None, None),
        ("queued", "running", 1, "w1", None),
        ("running", "running", 1, "ops", "cancel requested"),
        ("running", "cancelled", 1, "w1", "cancelled by ops"),
        ("cancelled", "cancelled", 1, "late", "result discarded: lease lost"),
    ]
    assert stored(conn, job_id) == 2  # the two notes


async def test_a_rescued_run_keeps_its_start(aconn: AConn, conn: Conn) -> None:
    job_id = await insert_job(aconn)
    await claim_one(aconn, "dead-1")
    await queries.sweep_stale(
        aconn,
        worker_id="sweeper",
        stale_after_s=60.0,
        decide=rescuer(rules_from(max_attempts={"t": 3})),
        now=datetime.now(UTC) + timedelta(seconds=300),
    )
    (from_, to, attempt, worker, _reason) = history(conn, job_id)[-1]
    assert history(conn, job_id)[:2] == [
        (None, "queued", 0, None, None),
        ("queued", "running", 1, "dead-1", None),
    ]
    assert (from_, to, attempt) == ("running", "queued", 1)
    assert worker == "sweeper"


async def test_creations_that_are_not_plain_are_stored(aconn: AConn, conn: Conn) -> None:
    later = await insert_job(aconn, run_after=datetime.now(UTC) + timedelta(hours=1))
    await aconn.execute("SELECT set_config('jobsd.actor', 'api', false)")
    by_actor = await insert_job(aconn)
    await aconn.execute("SELECT set_config('jobsd.actor', '', false)")
    plain = await insert_job(aconn)

    assert (stored(conn, later), stored(conn, by_actor), stored(conn, plain)) == (1, 1, 0)
    assert history(conn, later) == [(None, "scheduled", 0, None, None)]
    assert history(conn, by_actor) == [(None, "queued", 0, "api", None)]
    assert history(conn, plain) == [(None, "queued", 0, None, None)]


async def test_an_archived_job_reads_the_same_history(aconn: AConn, conn: Conn) -> None:
    job_id = await insert_job(aconn)
    first = await claim_one(aconn)
    await finish(aconn, first, "scheduled", "retry")
    await aconn.execute("UPDATE jobsd.jobs SET status = 'queued' WHERE id = %s", (job_id,))
    await finish(aconn, await claim_one(aconn), "succeeded", "done")
    before = history(conn, job_id)

    assert conn.execute("SELECT jobsd.archive_move(100, 0)").fetchone() == (1,)
    assert conn.execute("SELECT count(*) FROM jobsd.jobs WHERE id = %s", (job_id,)).fetchone() == (
        0,
    )
    assert history(conn, job_id) == before
    assert len(before) == 6


async def test_an_insert_cannot_bring_a_run_of_its_own(conn: Conn) -> None:
    for column in ("start_event_id", "end_event_id"):
        with pytest.raises(psycopg.errors.CheckViolation, match="a job starts queued"):
            conn.execute(f"INSERT INTO jobsd.jobs (org_id, type, {column}) VALUES ('acme', 't', 1)")


async def test_a_transition_no_statement_stamped_is_stored_and_checked(
    aconn: AConn, conn: Conn
) -> None:
    job_id = await insert_job(aconn)
    # a start without its id: stored by the trigger, as every unstamped change
    conn.execute(
        "UPDATE jobsd.jobs SET status = 'running', attempts = 1, lease_id = gen_random_uuid(),"
        " worker_id = 'raw' WHERE id = %s",
        (job_id,),
    )
    conn.execute("UPDATE jobsd.jobs SET status = 'succeeded' WHERE id = %s", (job_id,))
    assert stored(conn, job_id) == 2
    assert history(conn, job_id) == [
        (None, "queued", 0, None, None),
        ("queued", "running", 1, "raw", None),
        ("running", "succeeded", 1, "raw", None),
    ]
    with pytest.raises(psycopg.errors.CheckViolation, match="succeeded -> queued"):
        conn.execute("UPDATE jobsd.jobs SET status = 'queued' WHERE id = %s", (job_id,))
