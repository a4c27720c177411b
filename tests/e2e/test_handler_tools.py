"""kill -9 of a daemon leaves no process of any job: its handler processes die with it,
and its reaper ends the tools they started, and those its async handlers started."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support.processes import marked

from jobsd.client import SyncClient

from .conftest import Proc, make_env, poll, wait_status

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(90)
def test_kill_9_of_the_daemon_leaves_no_process_of_its_jobs(
    db_url: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    mark = uuid.uuid4().hex
    daemon = spawn("run", env=make_env(db_url, JOBSD_HANDLERS="tool_handlers", JOBSD_SLOTS="6"))
    daemon.wait_ready(timeout_s=60)
    with SyncClient(db_url) as client:
        jobs = [
            client.enqueue(kind, {"mark": mark}, org_id="acme")
            for kind in ["tools_then_hang"] * 4 + ["async_tool_then_hang"] * 2
        ]
    for job in jobs:
        poll(
            lambda job=job: (
                wait_status(conn, job.id, "running", timeout_s=30)["progress"] or {}
            ).get("tools"),
            what=f"the tools of {job.id} started",
            timeout_s=30,
        )
    # each sync job: two sleeps, a shell, and the shell's sleep in the background;
    # each async one (its tool in the daemon): a shell and its two sleeps
    poll(lambda: len(marked(mark)) == 4 * 4 + 2 * 3 or None, what="every tool runs")

    daemon.kill()
    left = poll(lambda: marked(mark) == [] or None, what="no process left", timeout_s=5)
    assert left is True
