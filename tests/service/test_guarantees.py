"""The handlers' guarantees (issue 11): on_fail after every move to failed, stalls, the
recover hook at every ambiguous end of an at_most_once job, progress caps."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from typing import Any

import anyio
import anyio.to_thread
import psycopg
import pytest
from support.history import assert_history_complete_async
from support.jobs import make_job

import jobsd
from jobsd.models import Job
from jobsd.ops import Caller
from jobsd.ops.cancel import cancel_job
from jobsd.recovery import AMBIGUOUS, RERUN, Recovery, succeeded
from jobsd.registry import Registry
from jobsd.store import queries

from .conftest import ADb, events_of, make_settings, running_daemon, wait_status, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def test_on_fail_runs_once_for_a_cascade_and_a_resolve_failed(
    db_url: str, db: ADb, conn: psycopg.Connection[Any], client: jobsd.Client, registry: Registry
) -> None:
    hooked: list[uuid.UUID] = []

    def on_fail(job: Job) -> None:
        hooked.append(job.id)

    @jobsd.handler("parent", on_fail=on_fail, registry=registry)
    async def parent(ctx: jobsd.JobContext) -> None:
        raise RuntimeError("the parent fails")

    @jobsd.handler("child", on_fail=on_fail, registry=registry)
    async def child(ctx: jobsd.JobContext) -> None:
        raise AssertionError("never runs: its dependency failed")

    settings = make_settings(db_url, death_check_interval=0.3)
    async with running_daemon(settings, registry) as daemon:
        up = await client.enqueue("parent", {}, org_id="acme")
        down = await client.enqueue("child", {}, org_id="acme", depends_on=[up.id])
        row = await wait_status(db, down.id, "failed")

        async def both() -> bool:
            return sorted(hooked) == sorted([up.id, down.id])

        await wait_until(both, what="on_fail of the parent and of its cascaded dependent")
        # an operator's resolve --failed, in another process: found by the next pass
        lost = make_job(conn, status="recovery_required", type="child", org_id="acme")
        await queries.resolve_job(db, lost, status="failed", reason="resolved", actor="op")

        async def three() -> bool:
            return lost in hooked

        await wait_until(three, what="on_fail after jobsd resolve --failed")
        calls = daemon.hooks.calls

    assert row["reason"] == f"dependency {up.id} failed"
    assert sorted(hooked) == sorted([up.id, down.id, lost]), "once per failure"
    assert calls == 3


async def test_on_fail_runs_once_for_a_job_failed_by_its_timeout(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    """A timeout retried by the policy is no failure; the last one is: one call, once."""
    hooked: list[tuple[uuid.UUID, str, str | None, int]] = []
    runs = [0]

    def on_fail(job: Job) -> None:
        hooked.append((job.id, job.status, job.reason, job.attempts))

    @jobsd.handler(
        "hangs",
        timeout=0.2,
        retry=jobsd.RetryPolicy(2, backoff=0.01, retry_on=(TimeoutError,)),
        on_fail=on_fail,
        registry=registry,
    )
    async def hangs(ctx: jobsd.JobContext) -> None:
        runs[0] += 1
        await anyio.sleep(60)  # cancelled by its timeout

    async with running_daemon(make_settings(db_url), registry) as daemon:
        job = await client.enqueue("hangs", {}, org_id="acme")
        row = await wait_status(db, job.id, "failed")

        async def called() -> bool:
            return bool(hooked)

        await wait_until(called, what="on_fail after the timeout")
        # another pass, as every daemon's next one: nothing left to call for this failure
        assert await daemon.hooks.run_once() == 0
        calls = daemon.hooks.calls

    assert (row["reason"], row["attempts"], runs[0]) == ("timeout", 2, 2)
    assert hooked == [(job.id, "failed", "timeout", 2)], "once, after the last attempt"
    assert calls == 1
    claimed = await db.execute("SELECT job_id FROM jobsd.fail_hooks")
    assert [r["job_id"] for r in await claimed.fetchall()] == [job.id]
    assert [e[1] for e in await events_of(db, job.id)] == [
        "queued",
        "running",
        "scheduled",
        "queued",
        "running",
        "failed",
    ]


async def test_every_ambiguous_end_of_an_at_most_once_job_asks_recover(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    """Timeout, cancel of a running job, shutdown past the drain, a sync thread that
    cannot be stopped: each asks the type's recover hook (owner death: test_recover.py,
    a lost child: test_isolation.py)."""
    asked: list[tuple[str, str | None]] = []
    answers: dict[str, Recovery] = {
        "timeout": succeeded({"found": "published"}),
        "cancel": RERUN,
        "shutdown": AMBIGUOUS,
        "thread": RERUN,
    }
    started = {case: anyio.Event() for case in answers}
    release = threading.Event()

    def recover(job: Job) -> Recovery:
        asked.append((job.payload["case"], job.reason))
        return answers[job.payload["case"]]

    @jobsd.handler(
        "publish", delivery="at_most_once", recover=recover, max_attempts=3, registry=registry
    )
    async def publish(ctx: jobsd.JobContext) -> None:
        started[ctx.payload["case"]].set()
        await anyio.sleep(0.5 if ctx.payload["case"] == "timeout" else 60)

    @jobsd.handler(
        "publish_sync",
        delivery="at_most_once",
        recover=recover,
        timeout=0.3,
        max_attempts=3,
        registry=registry,
    )
    def publish_sync(ctx: jobsd.JobContext) -> None:
        release.wait(30)  # cannot be stopped: the thread outlives its timeout

    @jobsd.handler(
        "publish_timeout",
        delivery="at_most_once",
        recover=recover,
        timeout=0.2,
        registry=registry,
    )
    async def publish_timeout(ctx: jobsd.JobContext) -> None:
        await anyio.sleep(60)

    settings = make_settings(db_url, drain_timeout=0.3)
    try:
        async with running_daemon(settings, registry) as daemon:
            timed = await client.enqueue("publish_timeout", {"case": "timeout"}, org_id="acme")
            stuck = await client.enqueue("publish_sync", {"case": "thread"}, org_id="acme")
            cancel = await client.enqueue("publish", {"case": "cancel"}, org_id="acme")
            with anyio.fail_after(10):
                await started["cancel"].wait()
            await cancel_job(db, Caller.as_operator("test"), cancel.id, reason="cancelled by test")
            rows = {
                "timeout": await wait_status(db, timed.id, "succeeded"),
                "cancel": await wait_status(db, cancel.id, "cancelled"),
            }

            async def thread_asked() -> bool:
                return ("thread", "timeout") in asked

            await wait_until(thread_asked, what="recover asked about the abandoned thread")
            down = await client.enqueue("publish", {"case": "shutdown"}, org_id="acme")
            with anyio.fail_after(10):
                await started["shutdown"].wait()
            assert daemon.runner.thread_alive(stuck.id)
    finally:
        release.set()
    rows["shutdown"] = await wait_status(db, down.id, "recovery_required")
    rows["thread"] = await wait_status(db, stuck.id, "recovery_required")

    assert sorted(asked) == [
        ("cancel", "cancel requested"),
        ("shutdown", "shutdown"),
        ("thread", "timeout"),
        ("timeout", "timeout"),
    ]
    assert (rows["timeout"]["reason"], rows["timeout"]["report"]) == (
        "recovered_after_publish",
        {"found": "published"},
    )
    assert rows["cancel"]["reason"] == "cancel requested", "RERUN of a cancel: cancelled"
    assert rows["thread"]["attempts"] == 1, "never re-run while its thread may run"
    assert rows["shutdown"]["reason"] == "shutdown"
    assert [e[1] for e in await events_of(db, timed.id)] == [
        "queued",
        "running",
        "recovery_required",
        "succeeded",
    ]
    await assert_history_complete_async(db)


async def test_a_handler_without_progress_is_ended_within_stall_after_plus_a_check(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    marks: dict[str, float] = {}

    @jobsd.handler("hang", stall_after=0.4, registry=registry)
    async def hang(ctx: jobsd.JobContext) -> None:
        for step in range(4):  # 0.6 s of work in all, but never 0.4 s without progress
            await ctx.progress(done=step)
            await anyio.sleep(0.15)
        marks["last_progress"] = time.monotonic()
        try:
            await anyio.sleep(60)
        finally:
            marks["ended"] = time.monotonic()

    @jobsd.handler("hang_sync", registry=registry)  # JOBSD_STALL_AFTER applies
    def hang_sync(ctx: jobsd.JobContext) -> None:
        release.wait(30)

    @jobsd.handler("busy", registry=registry)  # progress keeps it alive past stall_after
    async def busy(ctx: jobsd.JobContext) -> dict[str, int]:
        for step in range(5):
            await ctx.progress(done=step)
            await anyio.sleep(0.2)
        return {"steps": 5}

    release = threading.Event()
    try:
        async with running_daemon(make_settings(db_url, stall_after=0.6), registry):
            stalled = await client.enqueue("hang", {}, org_id="acme")
            stuck = await client.enqueue("hang_sync", {}, org_id="acme")
            alive = await client.enqueue("busy", {}, org_id="acme")
            rows = [
                await wait_status(db, j.id, "succeeded", "failed", "recovery_required")
                for j in (stalled, stuck, alive)
            ]
    finally:
        release.set()

    assert (rows[0]["status"], rows[0]["reason"]) == ("failed", "stalled")
    assert rows[0]["error"] == "stalled: no progress for 0.4 s"
    assert rows[0]["progress"]["done"] == 3
    # stall_after (0.4) + one check interval (0.1) + scheduling slack on a busy machine
    assert marks["ended"] - marks["last_progress"] < 0.4 + 0.1 + 0.3
    assert (rows[1]["status"], rows[1]["reason"]) == ("recovery_required", "stalled")
    assert rows[2]["status"] == "succeeded", "a handler that reports progress is not stalled"


async def test_progress_over_the_cap_fails_the_job(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler("chatty", registry=registry)
    async def chatty(ctx: jobsd.JobContext) -> None:
        await ctx.progress(step="small")
        await ctx.progress(blob="x" * 5000)  # raises: over 4 KiB in all

    @jobsd.handler("swallow", registry=registry)
    def swallow(ctx: jobsd.JobContext) -> dict[str, bool]:
        with contextlib.suppress(ValueError):  # catching it does not save the job
            ctx.progress(blob="x" * 5000)
        return {"ok": True}

    async with running_daemon(make_settings(db_url, max_progress_bytes=4096), registry):
        jobs = [await client.enqueue(t, {}, org_id="acme") for t in ("chatty", "swallow")]
        rows = [await wait_status(db, j.id, "succeeded", "failed") for j in jobs]

    for row in rows:
        assert (row["status"], row["reason"]) == ("failed", "progress too large"), row["type"]
        assert row["error"].startswith("progress too large: ")
        assert "over the limit of 4096 bytes" in row["error"]
        assert "blob" not in (row["progress"] or {}), "the oversized fields are not stored"


class _Escape(BaseException):
    """Not an Exception: it used to escape the executor."""


async def test_a_base_exception_from_a_handler_fails_only_its_job(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler("escape", registry=registry)
    async def escape(ctx: jobsd.JobContext) -> None:
        raise _Escape("out of the executor")

    @jobsd.handler("escape_sync", registry=registry)
    def escape_sync(ctx: jobsd.JobContext) -> None:
        raise KeyboardInterrupt

    @jobsd.handler("fine", registry=registry)
    async def fine(ctx: jobsd.JobContext) -> None:
        return None

    async with running_daemon(make_settings(db_url), registry):
        jobs = [await client.enqueue(t, {}, org_id="acme") for t in ("escape", "escape_sync")]
        rows = [await wait_status(db, j.id, "succeeded", "failed") for j in jobs]
        after = await client.enqueue("fine", {}, org_id="acme")
        assert (await wait_status(db, after.id, "succeeded", "failed"))["status"] == "succeeded"

    assert [(r["status"], r["reason"]) for r in rows] == [("failed", "handler error")] * 2
    assert rows[0]["error"] == "_Escape: out of the executor"
    assert rows[1]["error"].startswith("KeyboardInterrupt")


async def test_a_sync_handler_past_its_timeout_never_runs_twice_at_once(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    """The finding of issue 11: with a retry policy on TimeoutError, two runs of one job
    overlapped and both side effects landed while the job read `failed timeout`."""
    lock = threading.Lock()
    running, runs, overlap = [0], [0], [0]
    finished = threading.Event()

    @jobsd.handler(
        "slow_sync",
        timeout=0.3,
        retry=jobsd.RetryPolicy(2, backoff=0.01, retry_on=(TimeoutError,)),
        registry=registry,
    )
    def slow_sync(ctx: jobsd.JobContext) -> None:
        with lock:
            running[0] += 1
            runs[0] += 1
            overlap[0] = max(overlap[0], running[0])
        time.sleep(1.0)  # the side effect lands after the timeout
        with lock:
            running[0] -= 1
        finished.set()

    async with running_daemon(make_settings(db_url), registry):
        job = await client.enqueue("slow_sync", {}, org_id="acme")
        during = await wait_status(db, job.id, "recovery_required", "failed", "scheduled")
        thread_alive = not finished.is_set()
        with anyio.fail_after(10):
            await anyio.to_thread.run_sync(finished.wait)
        after = await wait_status(db, job.id, "recovery_required", "failed", "scheduled")

    assert thread_alive, "the job's status was written while its thread still ran"
    assert (during["status"], during["reason"]) == ("recovery_required", "timeout")
    assert after["status"] == "recovery_required", "still unknown: an operator decides"
    assert (runs[0], overlap[0], after["attempts"]) == (1, 1, 1), "never retried"
    assert [e[1] for e in await events_of(db, job.id)] == ["queued", "running", "recovery_required"]
