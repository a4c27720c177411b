"""Waking up: NOTIFY starts a job at once; with notifications off, the poll still does."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support.history import assert_history_complete

from jobsd.client import SyncClient

from .conftest import Proc, make_env, run_cli, scalar, wait_status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def pickup_latencies(conn: psycopg.Connection[Any], client: SyncClient, runs: int) -> list[float]:
    """Enqueue jobs one at a time on an idle daemon; return each one's enqueue->start delay."""
    latencies = []
    for _ in range(runs):
        job = client.enqueue("noop", {}, org_id="acme")
        wait_status(conn, job.id, "succeeded", timeout_s=40)
        latencies.append(
            float(
                scalar(
                    conn,
                    "SELECT extract(epoch FROM started_at - created_at) FROM jobsd.jobs "
                    "WHERE id = %s",
                    (job.id,),
                )
            )
        )
    return latencies


def test_notify_starts_a_job_on_an_idle_daemon_well_under_a_second(
    db_url: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    # a 30 s poll (20-40 s jittered): only a notification can start a job quickly
    daemon = spawn("run", env=make_env(db_url, JOBSD_POLL_INTERVAL="30"))
    daemon.wait_ready()
    with SyncClient(db_url) as client:
        # a first job run to its end: the start-up claim rounds are over
        pickup_latencies(conn, client, 1)
        latencies = pickup_latencies(conn, client, 3)
    assert max(latencies) < 0.5, f"pickup took {latencies} s with NOTIFY on"

    daemon.send(signal.SIGTERM)
    assert daemon.wait(20) == 0
    assert_history_complete(conn)


def test_with_notifications_off_the_poll_starts_jobs_within_two_intervals(
    db_url: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    env = make_env(db_url, JOBSD_NOTIFY="false", JOBSD_POLL_INTERVAL="1")
    switched = run_cli("notify", "off", env=env)
    assert switched.returncode == 0, switched.stderr
    assert switched.stdout == "notifications off\n"
    assert run_cli("notify", "status", env=env).stdout == "notifications off\n"

    # nothing is sent any more on an insert
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN jobsd")
        with SyncClient(db_url) as client:
            probe = client.enqueue("noop", {}, org_id="acme")
        assert list(listener.notifies(timeout=0.3)) == []

    daemon = spawn("run", env=env)
    daemon.wait_ready()
    wait_status(conn, probe.id, "succeeded", timeout_s=10)
    with SyncClient(db_url) as client:
        latencies = pickup_latencies(conn, client, 3)
    assert max(latencies) < 2.0, f"pickup took {latencies} s polling every 1 s"
    listening = scalar(
        conn,
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = 'jobsd-listen'",
    )
    assert listening == 0, "JOBSD_NOTIFY=false must not hold a LISTEN connection"

    daemon.send(signal.SIGTERM)
    assert daemon.wait(20) == 0
    assert run_cli("notify", "on", env=env).stdout == "notifications on\n"
    assert_history_complete(conn)
