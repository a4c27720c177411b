"""Owner death proven by a lock: a daemon killed with -9 has its jobs rescued within
seconds (not after the heartbeat threshold), each as its type's delivery says."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support.history import assert_history_complete

from jobsd.client import SyncClient

from .conftest import Proc, make_env, poll, scalar, wait_status

pytestmark = [pytest.mark.slow]


def _history(conn: psycopg.Connection[Any], job_id: object) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT from_status, to_status, attempt, reason FROM jobsd.all_job_events "
        "WHERE job_id = %s ORDER BY id",
        (job_id,),
    ).fetchall()


@pytest.mark.timeout(60)
def test_kill_9_rescues_within_the_lease_requeues_at_least_once_and_fails_at_most_once(
    side_db: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    # the stale threshold is 10 minutes: only the lock and the lease (2 s) can explain
    # a fast rescue
    env = make_env(
        side_db, JOBSD_STALE_AFTER="600", JOBSD_DEATH_CHECK_INTERVAL="0.5", JOBSD_WORKER_LEASE="2"
    )
    first = spawn("run", env=env)
    first.wait_ready()
    first_id = scalar(conn, "SELECT worker_id FROM jobsd.workers")
    assert first_id.split(":")[1] == str(first.pid)
    with SyncClient(side_db) as client:
        again = client.enqueue("slow_first_run", {}, org_id="acme")
        once = client.enqueue("publish_once", {}, org_id="acme")
    poll(
        lambda: scalar(conn, "SELECT count(*) FROM e2e_runs") == 2,
        what="both jobs to be running in the first daemon",
    )

    second = spawn("run", env=env)
    second.wait_ready()
    assert scalar(conn, "SELECT count(*) FROM jobsd.workers") == 2
    first.send(signal.SIGKILL)
    # both settled within 15 s of the kill: rescued by the lock and the lease
    rescued_by = time.monotonic() + 15
    assert first.wait(10) == -signal.SIGKILL

    wait_status(conn, again.id, "succeeded", timeout_s=rescued_by - time.monotonic())
    wait_status(conn, once.id, "failed", timeout_s=rescued_by - time.monotonic())
    # the dead worker is forgotten; the living one is still registered
    workers = [r[0] for r in conn.execute("SELECT worker_id FROM jobsd.workers")]
    assert workers and first_id not in workers

    assert _history(conn, again.id) == [
        (None, "queued", 0, None),
        ("queued", "running", 1, None),
        ("running", "queued", 1, "owner died"),
        ("queued", "running", 2, None),
        ("running", "succeeded", 2, None),
    ]
    assert _history(conn, once.id) == [
        (None, "queued", 0, None),
        ("queued", "running", 1, None),
        ("running", "failed", 1, "worker lost"),
    ]
    row = conn.execute("SELECT error FROM jobsd.jobs WHERE id = %s", (once.id,)).fetchone()
    assert row == ("worker lost: owner died at attempt 1",)
    # the at_most_once job ran once, though its type allows 3 attempts
    assert scalar(conn, "SELECT count(*) FROM e2e_runs WHERE job_id = %s", (once.id,)) == 1

    second.send(signal.SIGTERM)
    assert second.wait(20) == 0
    # a clean stop deregisters
    assert scalar(conn, "SELECT count(*) FROM jobsd.workers") == 0
    assert_history_complete(conn)


@pytest.mark.timeout(60)
def test_kill_9_leaves_jobs_claimed_ahead_queued_and_uncharged(
    side_db: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    # one slot, one attempt per job (the default): the daemon holds a run and two jobs
    # reserved ahead of it when it is killed; the reserved ones never started, were
    # never charged, and run once their reservation ends
    env = make_env(
        side_db,
        JOBSD_STALE_AFTER="600",
        JOBSD_DEATH_CHECK_INTERVAL="0.5",
        JOBSD_WORKER_LEASE="2",
        JOBSD_SLOTS="1",
        JOBSD_CLAIM_AHEAD="20",
        JOBSD_CLAIM_AHEAD_MAX_WAIT="2",  # no give-back before the kill
    )
    first = spawn("run", env=env)
    first.wait_ready()
    reserved = "SELECT status, attempts, reserved_until IS NOT NULL FROM jobsd.jobs WHERE id = %s"
    with SyncClient(side_db) as client:
        # a run of 50 ms first: claiming ahead goes on
        warm = client.enqueue("sleep", {"seconds": 0.05}, org_id="acme")
        wait_status(conn, warm.id, "succeeded")
        running = client.enqueue("sleep", {"seconds": 3600}, org_id="acme")
        wait_status(conn, running.id, "running")
        ahead = [client.enqueue("noop", {}, org_id="acme") for _ in range(2)]
        deadline = time.monotonic() + 10
        while [conn.execute(reserved, (j.id,)).fetchone() for j in ahead] != [
            ("queued", 0, True)
        ] * 2:
            assert time.monotonic() < deadline, "the jobs were not reserved"
            time.sleep(0.02)
    first.send(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    second = spawn(
        "run", env=make_env(side_db, JOBSD_DEATH_CHECK_INTERVAL="0.5", JOBSD_WORKER_LEASE="2")
    )
    second.wait_ready()
    for job in ahead:
        wait_status(conn, job.id, "succeeded", timeout_s=15)
        # their one run was their first attempt
        assert _history(conn, job.id) == [
            (None, "queued", 0, None),
            ("queued", "running", 1, None),
            ("running", "succeeded", 1, None),
        ]
    # the run that had started is charged: its owner died
    wait_status(conn, running.id, "failed", timeout_s=15)
    assert _history(conn, running.id)[-1] == (
        "running",
        "failed",
        1,
        "max attempts exceeded: owner died at attempt 1 of 1",
    )
    second.send(signal.SIGTERM)
    assert second.wait(20) == 0
    assert_history_complete(conn)
