"""Handlers in child processes (issue 11): crashes fail their job alone, timeouts kill the
child, results, progress and errors cross the process boundary."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
from support.history import assert_history_complete_async
from support.processes import pid_alive

import jobsd

from .conftest import ADb, make_settings, running_daemon, wait_status
from .isolated_handlers import REGISTRY

# child processes start a Python each (seconds on a loaded machine); exit codes and
# aborts: tests/faults (T15-isolated)
pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(90)]

ENDED = ("succeeded", "failed", "scheduled", "recovery_required")


async def _end(db: ADb, job: jobsd.Job) -> dict[str, Any]:
    return await wait_status(db, job.id, *ENDED, timeout_s=30)


async def test_a_segfaulting_child_fails_its_job_alone_while_siblings_succeed(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    async with running_daemon(make_settings(db_url, slots=4), REGISTRY) as daemon:
        crash = await client.enqueue("iso_segv", {}, org_id="acme")
        siblings = [await client.enqueue("iso_work", {"n": n}, org_id="acme") for n in range(3)]
        crashed = await _end(db, crash)
        rows = [await _end(db, job) for job in siblings]
        after = await _end(db, await client.enqueue("iso_sync", {}, org_id="acme"))
        # a lost child of an at_most_once type asks its recover hook
        lost = await client.enqueue("iso_publish_crash", {}, org_id="acme")
        lost_row = await wait_status(db, lost.id, "succeeded", "failed", timeout_s=30)
        assert not daemon.stopping

    assert (crashed["status"], crashed["reason"]) == ("failed", "handler crashed")
    assert crashed["error"] == "handler process killed by signal SIGSEGV (11)"
    assert crashed["report"]["error"]["returncode"] == -11
    assert [r["status"] for r in rows] == ["succeeded"] * 3
    assert sorted(r["report"]["doubled"] for r in rows) == [0, 2, 4]
    assert all(r["progress"]["done"] == 2 and r["progress"]["total"] == 2 for r in rows)
    assert all(r["report"]["pid"] != os.getpid() for r in rows), "ran in children"
    assert after["status"] == "succeeded" and after["report"]["attempt"] == 1
    assert (lost_row["status"], lost_row["reason"]) == ("succeeded", "recovered_after_publish")
    assert lost_row["report"] == {"found": "published"}
    await assert_history_complete_async(db)


async def test_timeouts_kill_the_child_errors_cross_and_reports_are_capped(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    settings = make_settings(db_url, kill_grace=0.5, max_report_bytes=4096, isolation="process")
    async with running_daemon(settings, REGISTRY) as daemon:
        hung = await client.enqueue("iso_hang", {}, org_id="acme")
        stubborn = await client.enqueue("iso_stubborn", {}, org_id="acme")
        raising = await client.enqueue("iso_raise", {}, org_id="acme")
        sizes = [100, 5000, 200_000]
        reports = [await client.enqueue("iso_big", {"size": n}, org_id="acme") for n in sizes]
        inline = await client.enqueue("big_inline", {}, org_id="acme")
        default = await client.enqueue("follows_default", {}, org_id="acme")
        row = await _end(db, hung)
        pid = row["progress"]["pid"]
        alive_after = pid_alive(pid)
        assert pid not in daemon.runner.children.pids
        killed = await _end(db, stubborn)
        alive_after_kill = pid_alive(killed["progress"]["pid"])
        raised = await wait_status(db, raising.id, "failed", timeout_s=30)
        capped = [await _end(db, j) for j in (*reports, inline)]
        followed = await _end(db, default)

    assert (row["status"], row["reason"]) == ("failed", "timeout")
    assert row["error"] == "timeout after 0.5 s"
    assert (row["finished_at"] - row["started_at"]).total_seconds() < 3
    assert not alive_after, "the child was killed before the outcome was written"
    # SIGTERM ignored: SIGKILL after the 0.5 s grace
    assert (killed["status"], killed["reason"]) == ("failed", "timeout")
    assert 0.9 <= (killed["finished_at"] - killed["started_at"]).total_seconds() < 4
    assert not alive_after_kill

    assert raised["attempts"] == 2, "KeyError is a LookupError: retried once"
    assert raised["reason"] == "handler error"
    assert raised["error"] == "KeyError: 'attempt 2'"
    assert raised["report"]["error"]["type"] == "builtins.KeyError"
    assert "raise KeyError" in raised["report"]["error"]["traceback"]

    assert followed["report"]["pid"] != os.getpid(), "JOBSD_ISOLATION=process applies"
    assert capped[0]["status"] == "succeeded"
    for row in capped[1:]:
        assert (row["status"], row["reason"]) == ("failed", "report too large"), row["type"]
        assert row["error"].startswith("report too large")
        assert row["report"] is None or "blob" not in row["report"]


async def test_a_child_that_cannot_start_fails_its_job_not_the_daemon(
    db_url: str, db: ADb, client: jobsd.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    async with running_daemon(make_settings(db_url), REGISTRY):
        job = await client.enqueue("iso_sync", {}, org_id="acme")
        row = await _end(db, job)
        inline = await _end(db, await client.enqueue("big_inline", {}, org_id="acme"))

    assert (row["status"], row["reason"]) == ("failed", "handler error")
    assert row["error"].startswith("ChildStartError: cannot start a handler process")
    assert inline["status"] == "succeeded", "the daemon went on"
