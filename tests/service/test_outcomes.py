"""How runs end: failures with a capped error, on_fail, sync handlers, unknown types,
bad results and timeouts. The daemon survives all of them."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.models import Job
from jobsd.registry import Registry

from .conftest import ADb, events_of, make_settings, running_daemon, wait_status, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def finish(db: ADb, job: Job) -> dict[str, Any]:
    """Wait for a job to end; return its row."""
    return await wait_status(db, job.id, "succeeded", "failed", "cancelled")


async def test_handler_exception_fails_the_job_calls_on_fail_and_the_daemon_goes_on(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    hooked: list[Job] = []
    hook_done = anyio.Event()
    # 3000 two-byte characters: 6000 bytes of UTF-8, three times the cap
    message = "é" * 3000 + " the end"

    async def on_fail(job: Job) -> None:
        hooked.append(job)
        hook_done.set()
        raise ValueError("a broken hook is logged, never raised")

    @jobsd.handler("explode", on_fail=on_fail, registry=registry)
    async def explode(ctx: jobsd.JobContext) -> None:
        raise RuntimeError(message)

    @jobsd.handler("fine", registry=registry)
    async def fine(ctx: jobsd.JobContext) -> dict[str, str]:
        return {"ok": "yes"}

    async with running_daemon(make_settings(db_url), registry) as daemon:
        bad = await client.enqueue("explode", {}, org_id="acme")
        row = await finish(db, bad)
        with anyio.fail_after(5):
            await hook_done.wait()
        # alive: later jobs, good and bad, still run
        good = await client.enqueue("fine", {}, org_id="acme")
        bad2 = await client.enqueue("explode", {}, org_id="acme")
        assert (await finish(db, good))["status"] == "succeeded"
        assert (await finish(db, bad2))["status"] == "failed"

        async def both_hooked() -> bool:
            return daemon.hooks.calls == 2

        # the hook runs after the outcome is written: wait for its second call
        await wait_until(both_hooked, what="on_fail of the second failed job")

    assert row["status"] == "failed"
    assert row["reason"] == "handler error"
    assert row["finished_at"] is not None
    assert row["error"].startswith("RuntimeError: ééé")
    assert len(row["error"].encode()) <= 2048
    cause = row["report"]["error"]
    assert cause["message"] == f"RuntimeError: {message}", "the full text is in the report"
    assert cause["type"] == "builtins.RuntimeError"
    assert "raise RuntimeError(message)" in cause["traceback"]
    assert hooked[0].id == bad.id
    assert hooked[0].status == "failed"
    assert hooked[0].error == row["error"]
    assert await events_of(db, bad.id) == [
        (None, "queued", 0, None),
        ("queued", "running", 1, None),
        ("running", "failed", 1, "handler error"),
    ]
    await assert_history_complete_async(db)


async def test_sync_handler_runs_in_a_worker_thread(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    threads: list[int] = []

    @jobsd.handler("reconcile", registry=registry)
    def reconcile(ctx: jobsd.JobContext) -> dict[str, Any]:
        threads.append(threading.get_ident())
        ctx.progress(done=1, total=1)  # plain call, no await
        if ctx.payload.get("fail"):
            raise KeyError("target missing")
        return {"target": ctx.payload["target"], "reconciled": True}

    async with running_daemon(make_settings(db_url), registry):
        ok = await client.enqueue("reconcile", {"target": 7}, org_id="acme")
        ko = await client.enqueue("reconcile", {"target": 8, "fail": True}, org_id="acme")
        ok_row, ko_row = await finish(db, ok), await finish(db, ko)

    assert ok_row["status"] == "succeeded"
    assert ok_row["report"] == {"target": 7, "reconciled": True}
    assert ok_row["progress"]["done"] == 1
    assert ko_row["status"] == "failed"
    assert ko_row["error"] == "KeyError: 'target missing'"
    assert len(threads) == 2
    assert threading.get_ident() not in threads, "a sync handler must not block the event loop"
    await assert_history_complete_async(db)


async def test_unknown_type_fails_explicitly(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler("known", registry=registry)
    async def known(ctx: jobsd.JobContext) -> None:
        return None

    # JOBSD_UNKNOWN_TYPES=fail; by default the job stays queued (test_known_types.py)
    async with running_daemon(make_settings(db_url, unknown_types="fail"), registry):
        stray = await client.enqueue("nobody_handles_this", {}, org_id="acme")
        fine = await client.enqueue("known", {}, org_id="acme")
        stray_row, fine_row = await finish(db, stray), await finish(db, fine)

    assert stray_row["status"] == "failed"
    assert stray_row["reason"] == "unknown type"
    assert "nobody_handles_this" in stray_row["error"]
    assert fine_row["status"] == "succeeded"
    assert fine_row["report"] is None
    await assert_history_complete_async(db)


@pytest.mark.parametrize(
    "result",
    [[1, 2], "done", 42, {"ratio": float("nan")}, {"text": "nul \x00 char"}, {"obj": object()}],
    ids=["list", "str", "int", "nan", "nul", "not-json"],
)
async def test_a_result_that_is_not_a_json_object_fails_the_job(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry, result: Any
) -> None:
    @jobsd.handler("odd", registry=registry)
    async def odd(ctx: jobsd.JobContext) -> Any:
        return result

    async with running_daemon(make_settings(db_url), registry):
        row = await finish(db, await client.enqueue("odd", {}, org_id="acme"))

    assert row["status"] == "failed"
    assert row["reason"] == "invalid report"
    assert "handler result" in row["error"]
    await assert_history_complete_async(db)


async def test_timeout_fails_the_job_with_reason_timeout(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler("slow_async", timeout=0.2, registry=registry)
    async def slow_async(ctx: jobsd.JobContext) -> None:
        await anyio.sleep(30)

    @jobsd.handler("slow_sync", timeout=0.2, registry=registry)
    def slow_sync(ctx: jobsd.JobContext) -> None:
        time.sleep(0.6)  # the thread is abandoned; it ends on its own shortly after

    @jobsd.handler("quick", timeout=5, registry=registry)
    async def quick(ctx: jobsd.JobContext) -> dict[str, bool]:
        return {"quick": True}

    async with running_daemon(make_settings(db_url), registry):
        jobs = [
            await client.enqueue(kind, {}, org_id="acme")
            for kind in ("slow_async", "slow_sync", "quick")
        ]
        rows = [
            await wait_status(db, job.id, "succeeded", "failed", "recovery_required")
            for job in jobs
        ]

    assert (rows[0]["status"], rows[0]["reason"]) == ("failed", "timeout")
    assert rows[0]["error"] == "timeout after 0.2 s"
    # the timeout is counted from the start of the run, not the enqueue
    assert (rows[0]["finished_at"] - rows[0]["started_at"]).total_seconds() < 2
    # a sync thread cannot be stopped: its outcome is unknown (issue 11), never "failed"
    assert (rows[1]["status"], rows[1]["reason"]) == ("recovery_required", "timeout")
    assert rows[1]["error"].startswith("timeout after 0.2 s; the handler's thread")
    assert rows[2]["status"] == "succeeded"
    await assert_history_complete_async(db)


async def test_a_handler_raising_its_own_timeout_error_is_a_handler_error(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    """A TimeoutError from the handler's own I/O is not jobsd's timeout, declared or not."""

    @jobsd.handler("upstream", registry=registry)
    async def upstream(ctx: jobsd.JobContext) -> None:
        raise TimeoutError("upstream API did not answer")

    @jobsd.handler("upstream_limited", timeout=30, registry=registry)
    async def upstream_limited(ctx: jobsd.JobContext) -> None:
        raise TimeoutError("upstream API did not answer")

    @jobsd.handler("after", registry=registry)
    async def after(ctx: jobsd.JobContext) -> None:
        return None

    async with running_daemon(make_settings(db_url), registry):
        first = await client.enqueue("upstream", {}, org_id="acme")
        second = await client.enqueue("upstream_limited", {}, org_id="acme")
        rows = [await finish(db, first), await finish(db, second)]
        later = await finish(db, await client.enqueue("after", {}, org_id="acme"))

    for row in rows:
        assert row["status"] == "failed"
        assert row["reason"] == "handler error"
        assert row["error"] == "TimeoutError: upstream API did not answer"
    assert later["status"] == "succeeded", "the daemon is still alive"
    await assert_history_complete_async(db)


async def test_system_exit_in_a_handler_fails_only_that_job(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler("quitter", registry=registry)
    async def quitter(ctx: jobsd.JobContext) -> None:
        raise SystemExit(2)

    @jobsd.handler("after", registry=registry)
    async def after(ctx: jobsd.JobContext) -> None:
        return None

    async with running_daemon(make_settings(db_url), registry):
        row = await finish(db, await client.enqueue("quitter", {}, org_id="acme"))
        later = await finish(db, await client.enqueue("after", {}, org_id="acme"))

    assert row["status"] == "failed"
    assert row["error"] == "SystemExit: 2"
    assert later["status"] == "succeeded"
    await assert_history_complete_async(db)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [({"note": "nul \x00 here"}, "NUL"), ({"ratio": float("nan")}, "progress")],
    ids=["nul", "nan"],
)
async def test_progress_postgres_would_refuse_fails_the_handler_not_the_daemon(
    db_url: str,
    db: ADb,
    client: jobsd.Client,
    registry: Registry,
    fields: dict[str, Any],
    fragment: str,
) -> None:
    @jobsd.handler("noisy", registry=registry)
    async def noisy(ctx: jobsd.JobContext) -> None:
        await ctx.progress(done=1, **fields)

    @jobsd.handler("after", registry=registry)
    async def after(ctx: jobsd.JobContext) -> None:
        await ctx.progress(done=2)

    async with running_daemon(make_settings(db_url), registry):
        row = await finish(db, await client.enqueue("noisy", {}, org_id="acme"))
        later = await finish(db, await client.enqueue("after", {}, org_id="acme"))

    assert row["status"] == "failed"
    assert row["error"].startswith("InvalidPayload: ")
    assert fragment in row["error"]
    assert later["status"] == "succeeded", "the daemon is still alive"
    assert later["progress"]["done"] == 2
    await assert_history_complete_async(db)
