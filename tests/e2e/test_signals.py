"""Stopping: SIGTERM or SIGINT lets the running job finish, claims nothing more, exits 0."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support.history import assert_history_complete

from jobsd.client import SyncClient
from jobsd.dev.embedded import EmbeddedPostgres
from jobsd.store.migrate import migrate_sync

from .conftest import Proc, job_status, make_env, scalar, wait_status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_lets_the_running_job_finish_and_exits_0(
    db_url: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc], sig: signal.Signals
) -> None:
    daemon = spawn("run", env=make_env(db_url))
    daemon.wait_ready()
    with SyncClient(db_url) as client:
        running = client.enqueue("sleep", {"seconds": 1.5}, org_id="acme")
        wait_status(conn, running.id, "running")
        daemon.send(sig)
        daemon.wait_for(r"\bdaemon\.stopping\b")
        # a claim in flight at the signal ends first (found once under load: the round
        # the sleep job's NOTIFY had started claimed the job enqueued here)
        daemon.wait_for(r"\bdaemon\.claiming_stopped\b")
        # stopped claiming: a job enqueued now waits for another daemon
        late = client.enqueue("noop", {}, org_id="acme")
        assert daemon.wait(20) == 0

    assert job_status(conn, running.id) == "succeeded"
    assert scalar(conn, "SELECT report FROM jobsd.jobs WHERE id = %s", (running.id,)) == {
        "slept": 1.5
    }
    assert job_status(conn, late.id) == "queued"
    assert "Traceback" not in daemon.text()
    assert_history_complete(conn)


def test_a_second_signal_cuts_the_drain_short_and_writes_the_job_back(
    db_url: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    daemon = spawn("run", env=make_env(db_url, JOBSD_DRAIN_TIMEOUT="60"))
    daemon.wait_ready()
    with SyncClient(db_url) as client:
        stuck = client.enqueue("sleep", {"seconds": 120}, org_id="acme")
        wait_status(conn, stuck.id, "running")
    daemon.send(signal.SIGTERM)
    daemon.wait_for(r"\bdaemon\.stopping\b")
    daemon.send(signal.SIGTERM)
    assert daemon.wait(20) == 0
    # 'sleep' allows one attempt: the interrupted run fails, explicitly
    assert job_status(conn, stuck.id) == "failed"
    assert scalar(conn, "SELECT reason FROM jobsd.jobs WHERE id = %s", (stuck.id,)) == "shutdown"
    assert_history_complete(conn)


def test_a_daemon_waiting_for_its_database_stops_on_sigterm_and_starts_once_it_is_back(
    make_cluster: Callable[..., EmbeddedPostgres], spawn: Callable[..., Proc]
) -> None:
    cluster = make_cluster()
    url = cluster.url()
    migrate_sync(url)
    cluster.stop()

    # stopped while it waits for the database: no hang until systemd's SIGKILL
    waiting = spawn("run", env=make_env(url))
    waiting.wait_for(r"\bdb\.retrying\b.*\blisten\b")
    waiting.send(signal.SIGTERM)
    assert waiting.wait(10) == 0
    assert "daemon.ready" not in waiting.text()

    # and one that waits long enough sees the database come back, then works
    patient = spawn("run", env=make_env(url))
    patient.wait_for(r"\bdb\.retrying\b.*\blisten\b")
    cluster.start()
    patient.wait_ready()
    with SyncClient(url) as client, psycopg.connect(url, autocommit=True) as conn:
        job = client.enqueue("noop", {}, org_id="acme")
        wait_status(conn, job.id, "succeeded")
        patient.send(signal.SIGTERM)
        assert patient.wait(20) == 0
        assert_history_complete(conn)
