"""The stale sweep judges each run by its own heartbeat, never by a previous run's.

A job claimed again (after a retry back-off, a rescue, a recover hook's rerun) keeps the
`progress` of its previous run, `updated_at` included, until its new owner's first
heartbeat: the sweep takes the latest of that heartbeat and the new run's start (fault
campaign finding T3-rerun).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbcheck import history, job_row

from jobsd.client import JobSpec
from jobsd.models import Job
from jobsd.store import queries
from jobsd.store.queries import FinishRow, HeartbeatRow

pytestmark = pytest.mark.anyio

Conn = psycopg.AsyncConnection[Any]
STALE_S = 60.0


async def _sweep(aconn: Conn, now: datetime | None = None) -> list[Job]:
    return await queries.sweep_stale(
        aconn,
        worker_id="sweeper",
        stale_after_s=STALE_S,
        max_attempts={"t": 5},
        default_max_attempts=1,
        now=now,
    )


async def _first_run_two_hours_ago(aconn: Conn, conn: Any) -> Job:
    """Enqueue a job, run it once (claim, heartbeat), then date that run 2 h back."""
    spec = JobSpec.build("t", {}, org_id="o")
    await queries.run_named(aconn, "jobs_insert", spec.insert_params())
    (run,) = await queries.claim_batch(
        aconn, limit=1, worker_id="w1", queues=None, keep_dedup_types=[]
    )
    assert run.lease_id is not None
    assert await queries.heartbeat_v2(aconn, [HeartbeatRow(run.id, run.lease_id, {"step": 3})])
    conn.execute(
        "UPDATE jobsd.jobs SET started_at = started_at - interval '2 hours', "
        "progress = progress || jsonb_build_object('updated_at', now() - interval '2 hours') "
        "WHERE id = %s",
        (run.id,),
    )
    return run


async def _claim_again(aconn: Conn, job: Job, how: str) -> Job:
    if how == "batch":
        (again,) = await queries.claim_batch(
            aconn, limit=1, worker_id="w2", queues=None, keep_dedup_types=[]
        )
        return again
    return await queries.claim_job(aconn, job.id, "w2")


@pytest.mark.parametrize("how", ["batch", "one"])
async def test_a_rescued_job_claimed_again_is_judged_by_its_new_start(
    aconn: Conn, conn: Any, how: str
) -> None:
    run = await _first_run_two_hours_ago(aconn, conn)
    # the first run is hung: 2 h without a heartbeat, swept on the database's clock
    assert [(j.id, j.status) for j in await _sweep(aconn)] == [(run.id, "queued")]

    again = await _claim_again(aconn, run, how)
    row = job_row(conn, run.id)
    assert row is not None
    # the new run still carries the old run's progress, stamp included
    assert row["progress"]["step"] == 3
    assert datetime.fromisoformat(row["progress"]["updated_at"]) < again.started_at

    assert await _sweep(aconn) == []  # not before its own first heartbeat
    row = job_row(conn, run.id)
    assert row is not None
    assert (row["status"], row["worker_id"], row["attempts"]) == ("running", "w2", 2)
    # a new run that never beats is stale STALE_S after its own start
    late = again.started_at + timedelta(seconds=STALE_S + 1)
    assert [j.status for j in await _sweep(aconn, now=late)] == ["queued"]
    assert [h[1] for h in history(conn, run.id)] == [
        "queued",
        "running",
        "queued",
        "running",
        "queued",
    ]


async def test_a_retried_job_is_judged_by_its_new_start(aconn: Conn, conn: Any) -> None:
    run = await _first_run_two_hours_ago(aconn, conn)
    assert run.lease_id is not None
    retry = FinishRow(run.id, run.lease_id, "scheduled", None, "boom", "retry", None, delay_s=0)
    assert list(await queries.finish_batch(aconn, [retry])) == [run.id]
    assert (await queries.promote_due(aconn)).promoted == 1
    again = await _claim_again(aconn, run, "batch")

    assert await _sweep(aconn) == []
    assert again.lease_id is not None
    # its first heartbeat takes over from its start
    assert await queries.heartbeat_v2(aconn, [HeartbeatRow(run.id, again.lease_id, None)])
    assert await _sweep(aconn, now=datetime.now(UTC) + timedelta(seconds=STALE_S / 2)) == []
    row = job_row(conn, run.id)
    assert row is not None
    assert (row["status"], row["attempts"]) == ("running", 2)


async def test_a_run_whose_heartbeat_is_newer_than_its_start_is_judged_by_it(
    aconn: Conn, conn: Any
) -> None:
    spec = JobSpec.build("t", {}, org_id="o")
    await queries.run_named(aconn, "jobs_insert", spec.insert_params())
    (run,) = await queries.claim_batch(
        aconn, limit=1, worker_id="w1", queues=None, keep_dedup_types=[]
    )
    assert run.lease_id is not None and run.started_at is not None
    # started long ago, beating still: alive
    conn.execute(
        "UPDATE jobsd.jobs SET started_at = started_at - interval '2 hours' WHERE id = %s",
        (run.id,),
    )
    assert await queries.heartbeat_v2(aconn, [HeartbeatRow(run.id, run.lease_id, None)])
    assert await _sweep(aconn) == []
    # and stale STALE_S after its last heartbeat
    assert await _sweep(aconn, now=datetime.now(UTC) + timedelta(seconds=STALE_S + 1)) != []


async def _claim_one_started_two_ahead(aconn: Conn) -> list[Job]:
    """Enqueue three jobs of a type allowed one attempt; claim them with one free slot:
    the first starts, the other two are claimed ahead."""
    for n in range(3):
        spec = JobSpec.build("once_only", {"n": n}, org_id="o")
        await queries.run_named(aconn, "jobs_insert", spec.insert_params())
    jobs = list(
        await queries.claim_batch(
            aconn, limit=3, free=1, worker_id="w1", queues=None, keep_dedup_types=[]
        )
    )
    assert [j.payload["n"] for j in jobs] == [0, 1, 2]
    return jobs


async def test_a_job_claimed_ahead_and_not_known_started_is_requeued_not_failed(
    aconn: Conn, conn: Any
) -> None:
    # the owner dies (here: goes silent) holding one run and two jobs claimed ahead, one
    # of which it had armed (to start it); one attempt allowed
    started, ahead_started, ahead = await _claim_one_started_two_ahead(aconn)
    assert ahead_started.lease_id is not None
    armed = await queries.arm_claimed_ahead(aconn, [(ahead_started.id, ahead_started.lease_id)])
    assert armed == {ahead_started.id}
    late = datetime.now(UTC) + timedelta(seconds=STALE_S + 1)
    swept = {j.id: (j.status, j.reason) for j in await _sweep(aconn, now=late)}
    assert swept == {
        started.id: ("failed", "max attempts exceeded"),
        ahead_started.id: ("failed", "max attempts exceeded"),
        # never started: back to queued as on a stop, its claim still counted
        ahead.id: ("queued", "not started"),
    }
    assert [(h[0], h[1], h[2], h[4]) for h in history(conn, ahead.id)] == [
        (None, "queued", 0, None),
        ("queued", "running", 1, None),
        ("running", "queued", 1, "not started"),
    ]
    row = job_row(conn, ahead.id)
    assert row is not None and row["claimed_ahead"] is None and row["lease_id"] is None


async def test_a_job_never_started_is_requeued_whatever_its_attempts(
    aconn: Conn, conn: Any
) -> None:
    # given back on stops and swept unstarted, its claims went past max_attempts: it
    # never ran, so it is never exhausted by them
    *_, ahead = await _claim_one_started_two_ahead(aconn)
    conn.execute("UPDATE jobsd.jobs SET attempts = 7 WHERE id = %s", (ahead.id,))
    late = datetime.now(UTC) + timedelta(seconds=STALE_S + 1)
    swept = {j.id: (j.status, j.reason, j.attempts) for j in await _sweep(aconn, now=late)}
    assert swept[ahead.id] == ("queued", "not started", 7)


async def test_a_claim_marks_only_the_jobs_beyond_the_free_slots(aconn: Conn, conn: Any) -> None:
    started, *ahead = await _claim_one_started_two_ahead(aconn)
    marks = {j.id: (job_row(conn, j.id) or {})["claimed_ahead"] for j in (started, *ahead)}
    assert marks == {started.id: None, ahead[0].id: True, ahead[1].id: True}
    assert [j.claimed_ahead for j in (started, *ahead)] == [False, True, True]
    # the outcome clears the mark; a stale lease arms nothing
    assert ahead[0].lease_id is not None
    done = FinishRow(ahead[0].id, ahead[0].lease_id, "succeeded", None, None, None, None)
    assert list(await queries.finish_batch(aconn, [done])) == [ahead[0].id]
    assert (job_row(conn, ahead[0].id) or {})["claimed_ahead"] is None
    assert await queries.arm_claimed_ahead(aconn, [(ahead[1].id, uuid.uuid4())]) == set()
    assert (job_row(conn, ahead[1].id) or {})["claimed_ahead"] is True


async def test_a_claim_leaves_the_armed_jobs_claimed_ahead_unmarked(aconn: Conn, conn: Any) -> None:
    for n in range(4):
        spec = JobSpec.build("t", {"n": n}, org_id="o")
        await queries.run_named(aconn, "jobs_insert", spec.insert_params())
    jobs = await queries.claim_batch(
        aconn, limit=4, free=1, armed=2, worker_id="w1", queues=None, keep_dedup_types=[]
    )
    # one starts, the next two may start when a slot frees, the last waits to be armed
    assert [j.claimed_ahead for j in jobs] == [False, False, False, True]
