"""Two daemon processes on one database: every job runs exactly once."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import anyio
import psycopg
import pytest
from support.history import assert_history_complete

import jobsd
from jobsd.client import JobSpec

from .conftest import Proc, make_env, poll, scalar

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

JOBS = 300


def test_two_daemon_processes_run_each_job_exactly_once(
    side_db: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    env = make_env(side_db, JOBSD_SLOTS="8")
    daemons = [spawn("run", env=env), spawn("run", env=env)]
    for daemon in daemons:
        daemon.wait_ready()

    async def enqueue_all() -> None:
        async with jobsd.Client(side_db) as client:
            # one statement: one NOTIFY wakes both daemons at once
            specs = [JobSpec.build("side_effect", {"n": n}, org_id="acme") for n in range(JOBS)]
            await client.enqueue_many(specs)

    anyio.run(enqueue_all)
    poll(
        lambda: (
            scalar(conn, "SELECT count(*) FROM jobsd.jobs WHERE status IN ('succeeded', 'failed')")
            == JOBS
        ),
        what=f"{JOBS} jobs to finish",
        timeout_s=60,
    )
    for daemon in daemons:
        daemon.send(signal.SIGTERM)
    assert [d.wait(20) for d in daemons] == [0, 0]

    by_state = conn.execute(
        "SELECT status, attempts, count(*) FROM jobsd.jobs GROUP BY 1, 2"
    ).fetchall()
    assert by_state == [("succeeded", 1, JOBS)]
    assert scalar(conn, "SELECT count(*) FROM e2e_side") == JOBS
    assert scalar(conn, "SELECT count(DISTINCT job_id) FROM e2e_side") == JOBS
    by_pid = dict(conn.execute("SELECT pid, count(*) FROM e2e_side GROUP BY pid").fetchall())
    assert set(by_pid) == {d.pid for d in daemons}, f"both processes took work: {by_pid}"
    assert (
        scalar(conn, "SELECT count(*) FROM jobsd.all_job_events WHERE to_status = 'running'")
        == JOBS
    )
    assert_history_complete(conn)
