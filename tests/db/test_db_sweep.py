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
from jobsd.worker.decide import rescuer, rules_from

pytestmark = pytest.mark.anyio

Conn = psycopg.AsyncConnection[Any]
STALE_S = 60.0


async def _sweep(aconn: Conn, now: datetime | None = None) -> list[Job]:
    return await queries.sweep_stale(
        aconn,
        worker_id="sweeper",
        stale_after_s=STALE_S,
        decide=rescuer(rules_from(max_attempts={"t": 5})),
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


async def test_a_run_of_a_registered_owner_is_judged_by_the_owner_s_lease(
    aconn: Conn, conn: Any
) -> None:
    spec = JobSpec.build("t", {}, org_id="o")
    await queries.run_named(aconn, "jobs_insert", spec.insert_params())
    (run,) = await queries.claim_batch(
        aconn, limit=1, worker_id="w1", queues=None, keep_dedup_types=[]
    )
    assert run.lease_id is not None and run.started_at is not None
    # started long ago, silent, but its owner's lease is current: alive
    conn.execute(
        "UPDATE jobsd.jobs SET started_at = started_at - interval '2 hours' WHERE id = %s",
        (run.id,),
    )
    conn.execute(
        "INSERT INTO jobsd.workers (worker_id, hostname, pid, alive_until) "
        "VALUES ('w1', 'h', 1, now())"
    )
    assert await queries.heartbeat_v2(aconn, [HeartbeatRow(run.id, run.lease_id, None)])
    assert await _sweep(aconn) == []
    # and stale STALE_S after the lease ended
    assert await _sweep(aconn, now=datetime.now(UTC) + timedelta(seconds=STALE_S + 1)) != []


async def _claim_one_started_two_ahead(aconn: Conn, reserve_s: float = 3600.0) -> list[Job]:
    """Enqueue three jobs of a type allowed one attempt; claim them with one free slot:
    the first starts, the other two are reserved ahead of the slots."""
    for n in range(3):
        spec = JobSpec.build("once_only", {"n": n}, org_id="o")
        await queries.run_named(aconn, "jobs_insert", spec.insert_params())
    jobs = list(
        await queries.claim_batch(
            aconn,
            limit=3,
            free=1,
            worker_id="w1",
            queues=None,
            keep_dedup_types=[],
            reserve_s=reserve_s,
        )
    )
    assert [j.payload["n"] for j in jobs] == [0, 1, 2]
    return jobs


async def test_a_claim_reserves_the_jobs_beyond_the_free_slots_without_charging_them(
    aconn: Conn, conn: Any
) -> None:
    started, *ahead = await _claim_one_started_two_ahead(aconn)
    assert (started.status, started.attempts, started.reserved_until) == ("running", 1, None)
    for job in ahead:
        row = job_row(conn, job.id)
        assert row is not None
        assert (row["status"], row["attempts"], row["worker_id"], row["started_at"]) == (
            "queued",
            0,
            "w1",
            None,
        )
        assert row["lease_id"] == job.lease_id and row["reserved_until"] is not None
        # no history: nothing happened to the job but a reservation
        assert [(h[0], h[1]) for h in history(conn, job.id)] == [(None, "queued")]
    # another daemon's claim passes the reservations by
    others = await queries.claim_batch(
        aconn, limit=5, worker_id="w2", queues=None, keep_dedup_types=[]
    )
    assert list(others) == []


async def test_the_sweep_leaves_reserved_jobs_alone_and_an_ended_reservation_is_claimable(
    aconn: Conn, conn: Any
) -> None:
    # the owner dies (here: goes silent) holding one run and two reserved jobs
    started, *ahead = await _claim_one_started_two_ahead(aconn)
    late = datetime.now(UTC) + timedelta(seconds=STALE_S + 1)
    swept = {j.id: (j.status, j.reason) for j in await _sweep(aconn, now=late)}
    assert swept == {
        started.id: ("failed", "max attempts exceeded: owner unresponsive at attempt 1 of 1")
    }
    conn.execute(
        "UPDATE jobsd.jobs SET reserved_until = now() - interval '1 second' WHERE id = %s",
        (ahead[0].id,),
    )
    (taken,) = await queries.claim_batch(
        aconn, limit=5, worker_id="w2", queues=None, keep_dedup_types=[]
    )
    # its first run: attempt 1, never charged by the reservation
    assert (taken.id, taken.status, taken.attempts, taken.worker_id) == (
        ahead[0].id,
        "running",
        1,
        "w2",
    )
    assert [(h[0], h[1], h[2]) for h in history(conn, ahead[0].id)] == [
        (None, "queued", 0),
        ("queued", "running", 1),
    ]


async def test_start_reserved_counts_the_attempt_under_a_fresh_lease(
    aconn: Conn, conn: Any
) -> None:
    _, first, second = await _claim_one_started_two_ahead(aconn)
    assert first.lease_id is not None and second.lease_id is not None
    new_first, new_second = uuid.uuid4(), uuid.uuid4()
    started = await queries.start_reserved(
        aconn,
        [(first.id, first.lease_id, new_first), (second.id, uuid.uuid4(), new_second)],
    )
    # a reservation whose lease is not the daemon's does not start
    assert set(started) == {first.id} and started[first.id].attempts == 1
    row = job_row(conn, first.id)
    assert row is not None
    assert (row["status"], row["lease_id"], row["attempts"], row["reserved_until"]) == (
        "running",
        new_first,
        1,
        None,
    )
    assert [(h[0], h[1], h[2], h[3]) for h in history(conn, first.id)] == [
        (None, "queued", 0, None),
        ("queued", "running", 1, "w1"),
    ]
    # tried again after a lost answer: the job started by the first try comes back,
    # charged once
    again = await queries.start_reserved(
        aconn, [(first.id, first.lease_id, new_first)], confirm=True
    )
    assert set(again) == {first.id} and again[first.id].attempts == 1
    assert (job_row(conn, first.id) or {})["attempts"] == 1
    # given back: queued, claimable, nothing charged, no history
    assert await queries.release_reserved(aconn, [(second.id, second.lease_id)]) == {second.id}
    row = job_row(conn, second.id)
    assert row is not None
    assert (row["status"], row["lease_id"], row["worker_id"], row["reserved_until"]) == (
        "queued",
        None,
        None,
        None,
    )
    assert await queries.release_reserved(aconn, [(second.id, second.lease_id)]) == set()
    assert [h[1] for h in history(conn, second.id)] == ["queued"]
