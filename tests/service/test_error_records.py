"""The errors of each attempt, written by a running daemon: a handler's exceptions under
its retry policy, timeouts, an isolated handler's traceback, a rescue from a lost
worker; a success adds none."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.registry import Registry

from .conftest import ADb, events_of, make_settings, running_daemon, wait_status
from .isolated_handlers import REGISTRY as ISOLATED
from .test_sweeper import make_zombie

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SETTINGS: dict[str, Any] = {"poll_interval": 0.1}


async def test_each_raise_under_a_retry_policy_is_recorded_and_a_success_adds_none(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler(
        "fetch",
        retry=jobsd.RetryPolicy(3, backoff=0.0, retry_on=(ValueError,)),
        registry=registry,
    )
    async def fetch(ctx: jobsd.JobContext) -> None:
        raise ValueError(f"boom {ctx.attempt}")

    @jobsd.handler(
        "slow",
        timeout=0.1,
        retry=jobsd.RetryPolicy(2, backoff=0.0, retry_on=(TimeoutError,)),
        registry=registry,
    )
    async def slow(ctx: jobsd.JobContext) -> None:
        await anyio.sleep(10)

    @jobsd.handler("fine", registry=registry)
    async def fine(ctx: jobsd.JobContext) -> dict[str, bool]:
        return {"ok": True}

    async with running_daemon(make_settings(db_url, **SETTINGS), registry):
        failing = await client.enqueue("fetch", {}, org_id="acme")
        timing_out = await client.enqueue("slow", {}, org_id="acme")
        ok = await client.enqueue("fine", {}, org_id="acme")
        for job in (failing, timing_out, ok):
            await wait_status(db, job.id, "succeeded", "failed")

    job = await client.get(failing.id)
    assert job.status == "failed" and job.attempts == 3
    assert [(e.attempt, e.cause, e.type, e.message) for e in job.errors] == [
        (3, "handler error", "builtins.ValueError", "ValueError: boom 3"),
        (2, "handler error", "builtins.ValueError", "ValueError: boom 2"),
        (1, "handler error", "builtins.ValueError", "ValueError: boom 1"),
    ]
    for record in job.errors:
        assert record.traceback is not None
        assert record.traceback.startswith("Traceback (most recent call last):\n")
        assert 'raise ValueError(f"boom {ctx.attempt}")' in record.traceback
        assert record.traceback.endswith(f"ValueError: boom {record.attempt}\n")
    assert job.errors[0].at > job.errors[1].at > job.errors[2].at
    # the history says retry, the records why; the last attempt's columns as before
    assert [e[3] for e in await events_of(db, failing.id) if e[0] == "running"] == [
        "retry",
        "retry",
        "handler error",
    ]
    assert (job.error, job.reason) == ("ValueError: boom 3", "handler error")
    assert job.report is not None and "boom 3" in job.report["error"]["traceback"]
    with jobsd.SyncClient(db_url) as sync:
        assert sync.get(failing.id).errors == job.errors

    timed = await client.get(timing_out.id)
    assert [(e.attempt, e.cause, e.type, e.traceback) for e in timed.errors] == [
        (2, "timeout", None, None),
        (1, "timeout", None, None),
    ]
    assert timed.errors[0].message == "timeout after 0.1 s"
    assert (await client.get(ok.id)).errors == []
    await assert_history_complete_async(db)


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_an_isolated_handlers_error_carries_its_traceback(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    async with running_daemon(make_settings(db_url, **SETTINGS), ISOLATED):
        # iso_raise raises a KeyError in a child process; its policy retries it once
        raising = await client.enqueue("iso_raise", {}, org_id="acme")
        await wait_status(db, raising.id, "failed", timeout_s=60)

    job = await client.get(raising.id)
    assert [(e.attempt, e.cause, e.type) for e in job.errors] == [
        (2, "handler error", "builtins.KeyError"),
        (1, "handler error", "builtins.KeyError"),
    ]
    for record in job.errors:
        assert record.message == f"KeyError: 'attempt {record.attempt}'"
        assert record.traceback is not None
        assert 'raise KeyError(f"attempt {ctx.attempt}")' in record.traceback
        assert record.traceback.rstrip().endswith(f"KeyError: 'attempt {record.attempt}'")


async def test_a_rescue_from_a_lost_worker_is_recorded_and_kept_after_a_success(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler("import_csv", max_attempts=3, registry=registry)
    async def import_csv(ctx: jobsd.JobContext) -> dict[str, int]:
        return {"attempt": ctx.attempt}

    zombie = await make_zombie(db, client, "import_csv", attempts=1, heartbeat_age_s=500)
    async with running_daemon(make_settings(db_url, stale_after=600), registry) as daemon:
        counts = await daemon.sweeper.run_once(now=datetime.now(UTC) + timedelta(seconds=200))
        assert counts == {"queued": 1}
        done = await wait_status(db, zombie, "succeeded", "failed")

    assert done["status"] == "succeeded" and done["attempts"] == 2
    job = await client.get(zombie)
    assert [(e.attempt, e.cause, e.type, e.traceback) for e in job.errors] == [
        (1, "worker lost", None, None)
    ]
    assert job.errors[0].message == "worker lost: owner unresponsive at attempt 1"
    assert job.error is None, "the job's own error column is as before"
    await assert_history_complete_async(db)
