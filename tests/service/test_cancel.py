"""Cancel: at once before the run; by request during it, honoured within a heartbeat
(async handlers are cancelled, sync ones see ``ctx.cancelled``); by the sweeper when
the owner died with a request pending."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import anyio
import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.errors import JobNotFound
from jobsd.ops import Caller
from jobsd.ops.cancel import CancelOutcome, cancel_job
from jobsd.registry import Registry

from .conftest import (
    ADb,
    events_of,
    fetch_job,
    make_settings,
    running_daemon,
    wait_status,
)
from .test_sweeper import make_zombie

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def cancel(db: ADb, job_id: object) -> CancelOutcome:
    caller = Caller.as_operator("test")
    return await cancel_job(db, caller, uuid.UUID(str(job_id)), reason="cancelled by test")


async def test_a_job_not_started_is_cancelled_at_once_and_frees_its_dedup_key(
    db: ADb, client: jobsd.Client
) -> None:
    queued = await client.enqueue("t", {}, org_id="acme", dedup_key="k")
    later = await client.enqueue(
        "t", {}, org_id="acme", run_after=datetime.now(UTC) + timedelta(hours=1)
    )
    for job in (queued, later):
        done = await cancel(db, job.id)
        assert done.action == "cancelled"
        assert done.job is not None and done.job.status == "cancelled"
        again = await cancel(db, job.id)
        assert again.action == "cancelled" and not again.changed
    assert (await events_of(db, later.id))[-1] == (
        "scheduled",
        "cancelled",
        0,
        "cancelled by test",
    )
    row = await fetch_job(db, queued.id)
    assert row["dedup_key"] is None and row["finished_at"] is not None
    with pytest.raises(JobNotFound):
        await cancel(db, "00000000-0000-7000-8000-000000000000")
    await assert_history_complete_async(db)


async def test_a_running_async_handler_is_cancelled_within_a_heartbeat(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    started = anyio.Event()
    interrupted = anyio.Event()

    @jobsd.handler("long", registry=registry)
    async def long(ctx: jobsd.JobContext) -> None:
        started.set()
        try:
            await anyio.sleep(60)
        finally:
            interrupted.set()

    async with running_daemon(make_settings(db_url), registry):
        job = await client.enqueue("long", {}, org_id="acme")
        with anyio.fail_after(10):
            await started.wait()
        # the heartbeat runs every 0.2 s here: interrupted and written within 5 s
        with anyio.fail_after(5):
            assert (await cancel(db, job.id)).action == "requested"
            await interrupted.wait()
            row = await wait_status(db, job.id, "cancelled", "failed", "succeeded")

    assert row["status"] == "cancelled"
    assert row["reason"] == "cancel requested"
    assert row["finished_at"] is not None
    assert (await events_of(db, job.id))[-1] == ("running", "cancelled", 1, "cancel requested")
    await assert_history_complete_async(db)


async def test_a_sync_handler_sees_the_cancelled_flag(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    started = threading.Event()
    saw_flag = threading.Event()

    @jobsd.handler("steps", registry=registry)
    def steps(ctx: jobsd.JobContext) -> None:
        started.set()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if ctx.cancelled:
                saw_flag.set()
                return
            time.sleep(0.01)

    async with running_daemon(make_settings(db_url), registry):
        job = await client.enqueue("steps", {}, org_id="acme")
        await anyio.to_thread.run_sync(started.wait, 10)
        assert (await cancel(db, job.id)).action == "requested"
        row = await wait_status(db, job.id, "cancelled", "failed", "succeeded")
        assert await anyio.to_thread.run_sync(saw_flag.wait, 10)
    assert row["status"] == "cancelled"


async def test_a_dead_owners_job_with_a_cancel_request_is_cancelled_not_rerun(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler("again", max_attempts=3, registry=registry)
    async def again(ctx: jobsd.JobContext) -> None:
        raise AssertionError("must not run again")

    job = await make_zombie(db, client, "again", attempts=1, heartbeat_age_s=500)
    assert (await cancel(db, job)).action == "requested"
    async with running_daemon(make_settings(db_url), registry) as daemon:
        later = datetime.now(UTC) + timedelta(seconds=200)
        await daemon.sweeper.sweep_stale(now=later)
        row = await wait_status(db, job, "cancelled", "queued", "running", "failed")
    assert row["status"] == "cancelled"
    assert (await events_of(db, job))[-1] == ("running", "cancelled", 1, "cancel requested")
    await assert_history_complete_async(db)
