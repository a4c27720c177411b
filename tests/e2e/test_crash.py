"""Crashes: a daemon killed with -9, and Postgres restarted under a busy daemon."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support.history import assert_history_complete

from jobsd.client import SyncClient
from jobsd.dev.embedded import EmbeddedPostgres
from jobsd.errors import BackendUnavailable
from jobsd.ids import uuid7
from jobsd.store.migrate import migrate_sync

from .conftest import Proc, create_side_tables, make_env, poll, scalar, wait_status

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(60)
def test_kill_9_mid_job_then_a_new_daemon_rescues_it_from_its_checkpoint(
    side_db: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    # the dead daemon's lock is free: the new one rescues its job once its lease (2 s)
    # is over, long before the stale threshold
    env = make_env(
        side_db,
        JOBSD_STALE_AFTER="600",
        JOBSD_DEATH_CHECK_INTERVAL="0.5",
        JOBSD_WORKER_LEASE="2",
        JOBSD_PROGRESS_INTERVAL="0.05",
    )
    first = spawn("run", env=env)
    first.wait_ready()
    with SyncClient(side_db) as client:
        job = client.enqueue("resumable_import", {"rows": 2000, "delay_s": 0.1}, org_id="acme")

    def done() -> int:
        progress = scalar(conn, "SELECT progress FROM jobsd.jobs WHERE id = %s", (job.id,))
        return int((progress or {}).get("done", 0))

    poll(lambda: done() >= 600, what="the import to be well under way")
    first.send(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    checkpoint = done()
    assert 600 <= checkpoint < 2000
    assert wait_status(conn, job.id, "running")["status"] == "running", "nobody has noticed yet"

    second = spawn("run", env=env)
    second.wait_ready()
    wait_status(conn, job.id, "succeeded", "failed", timeout_s=20)
    second.send(signal.SIGTERM)
    assert second.wait(20) == 0

    row = conn.execute(
        "SELECT status, attempts, report, worker_id FROM jobsd.jobs WHERE id = %s", (job.id,)
    ).fetchone()
    assert row is not None
    status, attempts, report, worker_id = row
    assert status == "succeeded"
    assert attempts == 2
    assert report["attempt"] == 2
    # resumed where the dead run's last progress write left it, not from row 0
    assert report["resumed_from"] == checkpoint
    assert worker_id.split(":")[1] == str(second.pid)
    # every batch imported; only those done since the last (throttled) progress write
    # before the kill were done twice: a batch takes 0.1 s, progress is written every 0.05 s
    batches = conn.execute("SELECT count(*), coalesce(sum(redone), 0) FROM e2e_batches").fetchone()
    assert batches is not None
    assert batches[0] == 20
    assert batches[1] <= 2
    events = conn.execute(
        "SELECT from_status, to_status, attempt, reason FROM jobsd.all_job_events "
        "WHERE job_id = %s ORDER BY id",
        (job.id,),
    ).fetchall()
    assert events == [
        (None, "queued", 0, None),
        ("queued", "running", 1, None),
        ("running", "queued", 1, "owner died"),
        ("queued", "running", 2, None),
        ("running", "succeeded", 2, None),
    ]
    assert_history_complete(conn)


class Enqueuer(threading.Thread):
    """Enqueue ``count`` jobs at a steady pace, riding out the database going away.

    Each job has a client-made id, so a retried submission after an ambiguous failure
    cannot create a second job.
    """

    def __init__(self, url: str, count: int, pace_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.count, self.pace_s = url, count, pace_s
        self.ids: list[uuid.UUID] = []
        self.retries = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with SyncClient(self.url) as client:
                for n in range(self.count):
                    job_id = uuid7()
                    deadline = time.monotonic() + 30
                    while True:
                        try:
                            client.enqueue(
                                "side_effect",
                                {"n": n, "seconds": 0.05},
                                org_id="acme",
                                job_id=job_id,
                            )
                            break
                        except BackendUnavailable:
                            self.retries += 1
                            if time.monotonic() > deadline:
                                raise
                            time.sleep(0.1)
                    self.ids.append(job_id)
                    time.sleep(self.pace_s)
        except BaseException as exc:
            self.error = exc


@pytest.mark.timeout(120)
def test_a_postgres_restart_mid_run_loses_no_job(
    make_cluster: Callable[..., EmbeddedPostgres], spawn: Callable[..., Proc]
) -> None:
    cluster = make_cluster()
    url = cluster.url()
    migrate_sync(url)
    create_side_tables(url)
    # a claim whose answer the restart cuts off leaves a running job nobody holds: the
    # sweeper gives it back after JOBSD_STALE_AFTER
    env = make_env(url, JOBSD_STALE_AFTER="6", JOBSD_SWEEP_INTERVAL="1")
    daemon = spawn("run", env=env)
    daemon.wait_ready()

    total = 120
    enqueuer = Enqueuer(url, total, pace_s=0.02)
    enqueuer.start()

    def count(query: str) -> int | None:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=2) as c:
                return int(scalar(c, query))
        except psycopg.OperationalError:
            return None

    poll(
        lambda: (count("SELECT count(*) FROM jobsd.jobs WHERE status = 'succeeded'") or 0) >= 20,
        what="the first jobs to finish",
    )
    cluster.restart()  # fast shutdown: every connection is cut, jobs are running
    enqueuer.join(60)
    assert not enqueuer.is_alive()
    assert enqueuer.error is None, repr(enqueuer.error)
    assert len(set(enqueuer.ids)) == total

    poll(
        lambda: count("SELECT count(*) FROM jobsd.jobs WHERE status = 'succeeded'") == total,
        what=f"all {total} jobs to succeed",
        timeout_s=60,
    )
    daemon.wait_for(r"\blistener\.reconnected\b", timeout_s=10)
    assert daemon.popen.poll() is None, "the daemon survived the restart"
    daemon.send(signal.SIGTERM)
    assert daemon.wait(30) == 0

    with psycopg.connect(url, autocommit=True) as conn:
        assert scalar(conn, "SELECT count(*) FROM jobsd.jobs") == total
        assert sorted(r[0] for r in conn.execute("SELECT id FROM jobsd.jobs")) == sorted(
            enqueuer.ids
        )
        # exactly once: one side-table row per job (a second run would have failed)
        assert scalar(conn, "SELECT count(*) FROM e2e_side") == total
        assert (
            scalar(conn, "SELECT count(*) FROM e2e_side s JOIN jobsd.jobs j ON j.id = s.job_id")
            == total
        )
        assert_history_complete(conn)
