"""Fencing: a worker paused (SIGSTOP) past its lease and the stale threshold loses its
job to another; resumed (SIGCONT) with that run still going, it exits at once (its
lease is over: nothing of it may run beside the rescue). The job's outcome is the new
owner's."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support.history import assert_history_complete

from jobsd.client import SyncClient
from jobsd.worker.fence import BREACH_EXIT_STATUS

from .conftest import Proc, make_env, poll, scalar, wait_status

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(90)
def test_a_paused_worker_loses_its_job_and_exits_when_resumed_past_its_lease(
    db_url: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    paused = spawn("run", env=make_env(db_url, JOBSD_STALE_AFTER="600", JOBSD_WORKER_LEASE="1.5"))
    paused.wait_ready()
    with SyncClient(db_url) as client:
        job = client.enqueue("whoami", {"seconds": 3}, org_id="acme")
    wait_status(conn, job.id, "running")
    paused.send(signal.SIGSTOP)
    try:
        # the paused daemon still holds its lock (its session lives): only its lease
        # (1.5 s) and the rescuer's stale threshold (2 s) past it can take the job
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

    # resumed past its lease, with a run going: it exits at once, before that run can
    # do anything more beside its rescue (EX_TEMPFAIL: systemd starts a fresh one)
    assert paused.wait(10) == BREACH_EXIT_STATUS
    paused.wait_for(r"\bworker\.fence_breached\b")

    wait_status(conn, job.id, "succeeded", "failed", timeout_s=20)
    row = conn.execute(
        "SELECT status, attempts, report FROM jobsd.jobs WHERE id = %s", (job.id,)
    ).fetchone()
    assert row is not None
    assert row[0] == "succeeded"
    assert row[2] == {"pid": rescuer.pid, "attempt": 2}, "the stale owner's result never applied"
    events = conn.execute(
        "SELECT from_status, to_status, attempt, reason FROM jobsd.all_job_events "
        "WHERE job_id = %s AND from_status IS DISTINCT FROM to_status ORDER BY id",
        (job.id,),
    ).fetchall()
    assert events == [
        (None, "queued", 0, None),
        ("queued", "running", 1, None),
        ("running", "queued", 1, "owner unresponsive"),
        ("queued", "running", 2, None),
        ("running", "succeeded", 2, None),
    ]
    rescuer.send(signal.SIGTERM)
    assert rescuer.wait(20) == 0
    assert_history_complete(conn)
