"""Every status change made through the named queries writes exactly one job_events row."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbcheck import history, job_row

from jobsd.client import JobSpec
from jobsd.models import Job
from jobsd.store import queries
from jobsd.store.enqueue import new_job
from jobsd.store.queries import FinishRow, HeartbeatRow
from jobsd.worker.decide import rescuer, rules_from

pytestmark = pytest.mark.anyio

Conn = psycopg.AsyncConnection[Any]


async def _enqueue(aconn: Conn, queue: str = "default", **kw: Any) -> Job:
    spec = JobSpec.build(kw.pop("type", "t"), {}, org_id="o", queue=queue, **kw)
    rows = await queries.run_named(aconn, "jobs_insert", spec.insert_params())
    return new_job(spec, rows[0])


async def _claim_one(aconn: Conn, worker: str, job: Job, keep: list[str] | None = None) -> Job:
    claimed = await queries.claim_batch(
        aconn, limit=1, worker_id=worker, queues=[job.queue], keep_dedup_types=keep or []
    )
    assert [j.id for j in claimed] == [job.id]
    return claimed[0]


def _finish(job: Job, status: str, **kw: Any) -> FinishRow:
    assert job.lease_id is not None
    fields: dict[str, Any] = {"report_json": None, "error": None, "reason": None, "progress": None}
    fields.update(kw)
    return FinishRow(job_id=job.id, lease_id=job.lease_id, status=status, **fields)


async def _sweep(aconn: Conn, *, after: timedelta, max_attempts: dict[str, int]) -> list[Job]:
    return await queries.sweep_stale(
        aconn,
        worker_id="sweeper-1",
        stale_after_s=600,
        decide=rescuer(rules_from(max_attempts=max_attempts)),
        now=datetime.now(UTC) + after,
    )


async def test_claim_and_finish_write_one_event_each(aconn: Conn, conn: Any) -> None:
    await aconn.execute("INSERT INTO jobsd.queues (name) VALUES ('a'), ('b')")
    ok = await _enqueue(aconn, "a")
    bad = await _enqueue(aconn, "b")
    ok_run = await _claim_one(aconn, "w1", ok)
    bad_run = await _claim_one(aconn, "w2", bad)

    written = await queries.finish_batch(
        aconn,
        [
            _finish(ok_run, "succeeded", report_json='{"rows": 3}'),
            _finish(bad_run, "failed", error="boom", reason="handler error"),
        ],
    )

    assert set(written) == {ok.id, bad.id}
    assert history(conn, ok.id) == [
        (None, "queued", 0, None, None),
        ("queued", "running", 1, "w1", None),
        ("running", "succeeded", 1, "w1", None),
    ]
    assert history(conn, bad.id) == [
        (None, "queued", 0, None, None),
        ("queued", "running", 1, "w2", None),
        ("running", "failed", 1, "w2", "handler error"),
    ]
    ok_row, bad_row = job_row(conn, ok.id), job_row(conn, bad.id)
    assert ok_row is not None and bad_row is not None
    assert (ok_row["status"], ok_row["report"], ok_row["finished_at"] is not None) == (
        "succeeded",
        {"rows": 3},
        True,
    )
    assert (bad_row["status"], bad_row["error"]) == ("failed", "boom")
    ats = [r[0] for r in conn.execute("SELECT at FROM jobsd.all_job_events ORDER BY id")]
    assert ats == sorted(ats)


async def test_sweep_requeues_then_fails_with_the_sweeper_as_actor(aconn: Conn, conn: Any) -> None:
    job = await _enqueue(aconn, type="crawl")
    await _claim_one(aconn, "w1", job)

    requeued = await _sweep(aconn, after=timedelta(hours=1), max_attempts={"crawl": 2})
    assert [(j.id, j.status, j.lease_id) for j in requeued] == [(job.id, "queued", None)]
    # the actor setting is local to the sweep's transaction: the next claim is w2's
    await _claim_one(aconn, "w2", job)
    failed = await _sweep(aconn, after=timedelta(hours=1), max_attempts={"crawl": 2})

    exhausted = "max attempts exceeded: owner unresponsive at attempt 2 of 2"
    assert [(j.status, j.error, j.attempts) for j in failed] == [("failed", exhausted, 2)]
    assert history(conn, job.id) == [
        (None, "queued", 0, None, None),
        ("queued", "running", 1, "w1", None),
        ("running", "queued", 1, "sweeper-1", "owner unresponsive"),
        ("queued", "running", 2, "w2", None),
        ("running", "failed", 2, "sweeper-1", exhausted),
    ]


async def test_unknown_type_gets_the_default_max_attempts(aconn: Conn, conn: Any) -> None:
    job = await _enqueue(aconn, type="mystery")
    await _claim_one(aconn, "w1", job)

    failed = await _sweep(aconn, after=timedelta(hours=1), max_attempts={"crawl": 5})

    assert [j.status for j in failed] == ["failed"]
    last = history(conn, job.id)[-1]
    assert last == (
        "running",
        "failed",
        1,
        "sweeper-1",
        "max attempts exceeded: owner unresponsive at attempt 1 of 1",
    )


async def test_a_live_owner_s_lease_keeps_a_job_from_the_sweeper(aconn: Conn, conn: Any) -> None:
    job = await _enqueue(aconn)
    run = await _claim_one(aconn, "w1", job)
    assert run.lease_id is not None
    # started long ago as far as the sweeper is concerned, but its owner renews its lease
    await aconn.execute(
        "UPDATE jobsd.jobs SET started_at = now() - interval '1 hour' WHERE id = %s", (job.id,)
    )
    await aconn.execute(
        "INSERT INTO jobsd.workers (worker_id, hostname, pid, alive_until) "
        "VALUES ('w1', 'h', 1, now())"
    )
    alive = set(
        await queries.heartbeat_v2(
            aconn,
            [
                HeartbeatRow(job.id, run.lease_id, {"done": 5}),
                HeartbeatRow(uuid.uuid4(), uuid.uuid4(), None),
            ],
        )
    )
    assert alive == {job.id}

    assert await _sweep(aconn, after=timedelta(minutes=5), max_attempts={}) == []
    swept = await _sweep(aconn, after=timedelta(minutes=11), max_attempts={})

    assert [j.id for j in swept] == [job.id]
    row = job_row(conn, job.id)
    assert row is not None and row["progress"]["done"] == 5
    # heartbeats are not status changes: no event for them
    assert [h[1] for h in history(conn, job.id)] == ["queued", "running", "failed"]


async def test_promote_writes_scheduled_to_queued(aconn: Conn, conn: Any) -> None:
    at = datetime.now(UTC) + timedelta(minutes=10)
    job = await _enqueue(aconn, run_after=at)
    other = await _enqueue(aconn, run_after=at + timedelta(minutes=10))

    early = await queries.promote_due(aconn, now=at - timedelta(seconds=1))
    assert (early.promoted, early.next_due) == (0, at)
    result = await queries.promote_due(aconn, now=at)

    assert (result.promoted, result.next_due) == (1, other.run_after)
    assert history(conn, job.id) == [
        (None, "scheduled", 0, None, None),
        ("scheduled", "queued", 0, None, "due"),
    ]
    assert history(conn, other.id) == [(None, "scheduled", 0, None, None)]


async def test_non_terminal_outcomes_keep_the_key_and_the_runs_lease(
    aconn: Conn, conn: Any
) -> None:
    await aconn.execute("INSERT INTO jobsd.queues (name) VALUES ('a'), ('b')")
    stopped = await _enqueue(aconn, "a", type="crawl", dedup_key="site-1")
    retried = await _enqueue(aconn, "b", type="crawl", dedup_key="site-2")
    stopped_run = await _claim_one(aconn, "w1", stopped, keep=["crawl"])
    retried_run = await _claim_one(aconn, "w1", retried, keep=["crawl"])
    later = datetime.now(UTC) + timedelta(minutes=1)

    written = await queries.finish_batch(
        aconn,
        [
            # the daemon stopped mid-run: back to queued, with the checkpoint
            _finish(stopped_run, "queued", reason="shutdown", progress={"page": 4}),
            # a retry policy's back-off: scheduled for later
            _finish(retried_run, "scheduled", reason="retry", error="429", run_after=later),
        ],
    )

    for run, status in ((stopped_run, "queued"), (retried_run, "scheduled")):
        again = written[run.id]
        # the run's lease stays (a write tried again finds it); the next claim writes
        # a new one, and nothing but a running row takes a worker's write
        assert (again.status, again.lease_id, again.finished_at) == (status, run.lease_id, None)
    late = _finish(stopped_run, "succeeded")
    assert await queries.finish_batch(aconn, [late]) == {}
    # the same write again, after an answer that never came: found, changed nothing
    again = _finish(stopped_run, "queued", reason="shutdown", progress={"page": 4})
    confirmed = await queries.finish_batch(aconn, [again, late], confirm=True)
    assert {k: v.status for k, v in confirmed.items()} == {stopped.id: "queued"}
    assert history(conn, stopped.id)[-1] == ("running", "queued", 1, "w1", "shutdown")
    assert written[stopped.id].dedup_key == "site-1"
    assert written[retried.id].dedup_key == "site-2"
    assert written[stopped.id].progress == {"page": 4}
    assert written[retried.id].run_after == later
    assert history(conn, stopped.id)[-1] == ("running", "queued", 1, "w1", "shutdown")
    assert history(conn, retried.id)[-1] == ("running", "scheduled", 1, "w1", "retry")
    # the scheduled one becomes claimable only when due
    assert (await queries.promote_due(aconn, now=later)).promoted == 1
    promoted = history(conn, retried.id)[-1]
    # (the worker column names the job's last worker here: promote sets no actor)
    assert (promoted[0], promoted[1], promoted[2], promoted[4]) == ("scheduled", "queued", 1, "due")


async def test_bulk_insert_writes_one_event_per_job(aconn: Conn, conn: Any) -> None:
    specs = [JobSpec.build("t", {"i": i}, org_id="o") for i in range(25)]
    params: dict[str, list[Any]] = {
        "ids": [s.id for s in specs],
        "org_ids": [s.org_id for s in specs],
        "types": [s.type for s in specs],
        "queues": [s.queue for s in specs],
        "dedup_keys": [None] * 25,
        "payloads": [json.dumps({"i": i}) for i in range(25)],
        "run_afters": [None] * 25,
        "priorities": [0] * 25,
        "concurrency_keys": [None] * 25,
        "trace_contexts": [None] * 25,
    }
    rows = await queries.run_named(aconn, "jobs_insert_many", params)

    assert len(rows) == 25
    events = conn.execute(
        "SELECT job_id, from_status, to_status FROM jobsd.all_job_events ORDER BY id"
    ).fetchall()
    assert events == [(s.id, None, "queued") for s in specs]
