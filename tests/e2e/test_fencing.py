"""Fencing: a worker paused (SIGSTOP) past the heartbeat threshold loses its job to
another; resumed (SIGCONT), it learns so at its next write, and its result is
discarded with an event saying so. The job's outcome is the new owner's."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support.history import assert_history_complete

from jobsd.client import SyncClient

from .conftest import Proc, make_env, poll, scalar, wait_status

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(90)
def test_a_paused_worker_loses_its_lease_and_its_late_result_is_discarded_with_evidence(
    db_url: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    paused = spawn("run", env=make_env(db_url, JOBSD_STALE_AFTER="600"))
    paused.wait_ready()
    paused_id = scalar(conn, "SELECT worker_id FROM jobsd.workers")
    with SyncClient(db_url) as client:
        job = client.enqueue("whoami", {"seconds": 3}, org_id="acme")
    wait_status(conn, job.id, "running")
    paused.send(signal.SIGSTOP)
    try:
        # the paused daemon still holds its lock (its session lives): only the
        # heartbeat threshold can take the job from it
        rescuer = spawn(
            "run", env=make_env(db_url, JOBSD_STALE_AFTER="2", JOBSD_SWEEP_INTERVAL="0.3")
        )
        rescuer.wait_ready()
        poll(
            lambda: scalar(conn, "SELECT attempts FROM jobsd.jobs WHERE id = %s", (job.id,)) == 2,
            what="the rescuer to run the job again",
        )
    finally:
        paused.send(signal.SIGCONT)

    def discard_note() -> Any:
        return conn.execute(
            "SELECT from_status, to_status, worker_id FROM jobsd.job_events "
            "WHERE job_id = %s AND reason = 'result discarded: lease lost'",
            (job.id,),
        ).fetchall()

    notes = poll(discard_note, what="the paused worker's discarded-result event")
    assert [(n[0], n[1], n[2]) for n in notes] == [(notes[0][0], notes[0][0], paused_id)]
    paused.wait_for(r"\bjob\.(lease_lost|result_discarded)\b")

    wait_status(conn, job.id, "succeeded", "failed", timeout_s=20)
    row = conn.execute(
        "SELECT status, attempts, report FROM jobsd.jobs WHERE id = %s", (job.id,)
    ).fetchone()
    assert row is not None
    assert row[0] == "succeeded"
    assert row[2] == {"pid": rescuer.pid, "attempt": 2}, "the stale owner's result never applied"
    events = conn.execute(
        "SELECT from_status, to_status, attempt, reason FROM jobsd.job_events "
        "WHERE job_id = %s AND from_status IS DISTINCT FROM to_status ORDER BY id",
        (job.id,),
    ).fetchall()
    assert events == [
        (None, "queued", 0, None),
        ("queued", "running", 1, None),
        ("running", "queued", 1, "stale heartbeat"),
        ("queued", "running", 2, None),
        ("running", "succeeded", 2, None),
    ]
    for proc in (paused, rescuer):
        proc.send(signal.SIGTERM)
        assert proc.wait(20) == 0
    assert_history_complete(conn)
