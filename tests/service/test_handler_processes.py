"""Handler processes under the default settings: a crash fails one job, nothing a
handler starts outlives it, children are recycled by job count and memory."""

from __future__ import annotations

import collections
import os
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.processes import marked

import jobsd

from .conftest import ADb, make_settings, running_daemon, wait_status, wait_until
from .process_handlers import REGISTRY

# handler processes start a Python each (about a second on a loaded machine)
pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(90)]

ENDED = ("succeeded", "failed", "scheduled", "recovery_required", "cancelled")


async def _end(db: ADb, job: jobsd.Job, timeout_s: float = 30) -> dict[str, Any]:
    return await wait_status(db, job.id, *ENDED, timeout_s=timeout_s)


async def test_by_default_a_segfaulting_sync_handler_fails_alone(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    async with running_daemon(make_settings(db_url, slots=8), REGISTRY) as daemon:
        siblings = [
            await client.enqueue(kind, {"sleep_s": 5.0}, org_id="acme")
            for kind in ("proc_async", "proc_sync") * 3
        ]
        for job in siblings:  # every sibling runs when the crash comes
            await wait_status(db, job.id, "running", timeout_s=30)
        crash = await client.enqueue("proc_segv", {}, org_id="acme")
        crashed = await _end(db, crash)
        rows = [await _end(db, job) for job in siblings]
        assert not daemon.stopping

    assert (crashed["status"], crashed["reason"]) == ("failed", "handler crashed")
    assert crashed["error"] == "handler process killed by signal SIGSEGV (11)"
    assert [r["status"] for r in rows] == ["succeeded"] * 6
    pids = [r["report"]["pid"] for r in rows]
    assert pids[0::2] == [os.getpid()] * 3, "async handlers run in the daemon"
    assert os.getpid() not in pids[1::2] and len(set(pids[1::2])) == 3, "sync ones apart"


async def test_a_timed_out_handler_leaves_no_process_and_its_tool_no_effect(
    db_url: str, db: ADb, client: jobsd.Client, tmp_path: Path
) -> None:
    mark = uuid.uuid4().hex
    effect = tmp_path / "effect"
    # the group is killed about 1 s after the tool starts (0.5 s timeout, 0.5 s grace);
    # an effect due at 3 s leaves a busy machine 2 s of margin before it could land
    payload = {"mark": mark, "effect": str(effect), "effect_s": 3.0}
    async with running_daemon(make_settings(db_url, kill_grace=0.5), REGISTRY):
        job = await client.enqueue("proc_tools_then_hang", payload, org_id="acme")
        await wait_status(db, job.id, "running", timeout_s=30)
        row = await _end(db, job)
        left_at_outcome = marked(mark)
        # the tool would have written its effect 3 s after it started: watch for it
        # until past that
        landed = False
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not landed:
            landed = effect.exists()
            await anyio.sleep(0.05)

    assert (row["status"], row["reason"]) == ("failed", "timeout")
    assert row["error"] == "timeout after 0.5 s"
    assert row["progress"]["tools"] == "started"
    assert left_at_outcome == [], "the whole group ended before the outcome was written"
    assert not landed


async def test_tools_a_handler_leaves_running_end_before_its_outcome(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    mark = uuid.uuid4().hex
    async with running_daemon(make_settings(db_url), REGISTRY) as daemon:
        job = await client.enqueue("proc_tools_left", {"mark": mark}, org_id="acme")
        row = await _end(db, job)
        left = marked(mark)
        again = await _end(db, await client.enqueue("proc_counted", {}, org_id="acme"))
        children = set(daemon.runner.children.pids)

    assert row["status"] == "succeeded"
    assert left == []
    assert again["report"]["pid"] == row["report"]["pid"] in children, "the child was reused"


async def test_a_leaking_child_is_replaced_before_its_ceiling_and_no_job_fails(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    async with running_daemon(make_settings(db_url, slots=1), REGISTRY) as daemon:
        jobs = [await client.enqueue("proc_leak", {}, org_id="acme") for _ in range(30)]
        rows = [await _end(db, job) for job in jobs]
        recycled = daemon.runner.children.recycled
        hog = await _end(db, await client.enqueue("proc_hog", {}, org_id="acme"))

    assert [r["status"] for r in rows] == ["succeeded"] * 30
    per_child = collections.Counter(r["report"]["pid"] for r in rows)
    assert len(per_child) >= 2 and recycled >= 1
    # a child never grew past its ceiling: 220 MB, its own start included
    assert max(r["report"]["leaked_mb"] for r in rows) < 220
    assert (hog["status"], hog["reason"]) == ("failed", "memory limit")
    assert hog["error"].startswith("memory limit: the handler process reached ")
    assert hog["error"].endswith("over its limit of 220000000 bytes")


async def test_max_jobs_per_child_gives_each_child_that_many_jobs(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    async with running_daemon(make_settings(db_url, slots=1), REGISTRY):
        jobs = [await client.enqueue("proc_counted", {}, org_id="acme") for _ in range(15)]
        rows = [await _end(db, job) for job in jobs]

    per_child = collections.Counter(r["report"]["pid"] for r in rows)
    assert sorted(per_child.values()) == [5, 5, 5]


async def test_a_cancel_reaches_a_running_handler_without_waiting_for_the_heartbeat(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    # a heartbeat every 30 s: only the cancel's notification can stop them in time
    settings = make_settings(db_url, heartbeat_interval=30.0, kill_grace=0.5)
    took: list[float] = []
    async with running_daemon(settings, REGISTRY):
        for kind in ("proc_until_cancelled", "async_until_cancelled"):
            job = await client.enqueue(kind, {}, org_id="acme")
            await wait_until(lambda job=job: _running(db, job), what="the handler runs")
            t0 = time.monotonic()
            outcome = await client.cancel(job.id)
            row = await wait_status(db, job.id, "cancelled", timeout_s=5)
            took.append(time.monotonic() - t0)
            assert (outcome.action, row["reason"]) == ("requested", "cancel requested")

    assert max(took) < 1.0, took


async def _running(db: ADb, job: jobsd.Job) -> bool:
    row = await (
        await db.execute("SELECT progress FROM jobsd.jobs WHERE id = %s", (job.id,))
    ).fetchone()
    return bool(row and (row["progress"] or {}).get("running"))


async def test_run_tool_in_handlers_results_missing_tools_and_cancels(
    db_url: str, db: ADb, client: jobsd.Client, tmp_path: Path
) -> None:
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(b"\xff\xd8" + b"\x00" * 1000)
    mark = uuid.uuid4().hex
    settings = make_settings(db_url, heartbeat_interval=30.0, kill_grace=0.5)
    async with running_daemon(settings, REGISTRY):
        read = await _end(
            db, await client.enqueue("proc_metadata", {"path": str(photo)}, org_id="acme")
        )
        missing = await _end(db, await client.enqueue("proc_missing_tool", {}, org_id="acme"))
        job = await client.enqueue("async_tool_until_cancelled", {"mark": mark}, org_id="acme")
        await wait_until(lambda: _running(db, job), what="the tool runs")
        await wait_until(lambda: _marked(mark), what="the tool started")
        await client.cancel(job.id)
        cancelled = await wait_status(db, job.id, "cancelled", timeout_s=5)
        left = marked(mark)

    assert read["status"] == "succeeded" and read["report"]["metadata"] == {"size": 1002}
    assert (missing["status"], missing["reason"]) == ("failed", "handler error")
    assert missing["error"] == (
        "FileNotFoundError: [Errno 2] No such file or directory: 'no-such-tool-here'"
    )
    assert cancelled["reason"] == "cancel requested"
    assert left == []


async def _marked(mark: str) -> bool:
    return bool(marked(mark))
