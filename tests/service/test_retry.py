"""Explicit retries: a matching error schedules the job again after the back-off, with
an event; anything else, or the last attempt, fails it at once."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.registry import Registry

from .conftest import ADb, events_of, fetch_job, make_settings, running_daemon, wait_status

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

# a poll every 0.1 s promotes a due retry quickly
SETTINGS: dict[str, Any] = {"poll_interval": 0.1}


async def test_a_matching_error_is_retried_after_the_backoff_until_it_succeeds(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    seen: list[tuple[int, str | None]] = []

    @jobsd.handler(
        "fetch",
        retry=jobsd.RetryPolicy(3, backoff=0.3, retry_on=(OSError,)),
        dedup_scope="active",
        registry=registry,
    )
    async def fetch(ctx: jobsd.JobContext) -> dict[str, int]:
        row = await fetch_job(db, ctx.id)
        seen.append((ctx.attempt, row["dedup_key"]))
        if ctx.attempt < 3:
            raise ConnectionResetError(f"flaky {ctx.attempt}")
        return {"attempt": ctx.attempt}

    async with running_daemon(make_settings(db_url, **SETTINGS), registry):
        job = await client.enqueue("fetch", {}, org_id="acme", dedup_key="fetch:1")
        waiting = await wait_status(db, job.id, "scheduled")
        # while it waits: not running (its run's lease, kept, can write nothing more),
        # the dedup key still held (scope 'active': until the job ends), the cause
        # recorded
        assert waiting["status"] == "scheduled" and waiting["worker_id"] is not None
        assert waiting["dedup_key"] == "fetch:1"
        assert waiting["error"] == "ConnectionResetError: flaky 1"
        assert waiting["report"]["error"]["type"] == "builtins.ConnectionResetError"
        assert (waiting["run_after"] - waiting["started_at"]).total_seconds() >= 0.3
        done = await wait_status(db, job.id, "succeeded", "failed")

    assert done["status"] == "succeeded"
    assert done["report"] == {"attempt": 3}
    assert seen == [(1, "fetch:1"), (2, "fetch:1"), (3, "fetch:1")]
    assert done["dedup_key"] is None, "released at the end"
    history = await events_of(db, job.id)
    assert history == [
        (None, "queued", 0, None),
        ("queued", "running", 1, None),
        ("running", "scheduled", 1, "retry"),
        ("scheduled", "queued", 1, "due"),
        ("queued", "running", 2, None),
        ("running", "scheduled", 2, "retry"),
        ("scheduled", "queued", 2, "due"),
        ("queued", "running", 3, None),
        ("running", "succeeded", 3, None),
    ]
    cur = await db.execute(
        "SELECT at FROM jobsd.all_job_events WHERE job_id = %s ORDER BY id", (job.id,)
    )
    at = [r["at"] for r in await cur.fetchall()]
    # the back-off was respected: the second run started no earlier than its run_after
    # (an event's `at` is the clock when its row was written, later than the now() that
    # run_after was computed from, so the gap between two events may be a hair shorter)
    assert at[4] >= waiting["run_after"], "the back-off was respected"
    await assert_history_complete_async(db)


async def test_other_errors_and_the_last_attempt_fail_at_once(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler(
        "fetch",
        retry=jobsd.RetryPolicy(2, backoff=0.0, retry_on=(OSError,)),
        registry=registry,
    )
    async def fetch(ctx: jobsd.JobContext) -> None:
        if ctx.payload["kind"] == "value":
            raise ValueError("not retried")
        raise OSError("retried once")

    async with running_daemon(make_settings(db_url, **SETTINGS), registry):
        other = await client.enqueue("fetch", {"kind": "value"}, org_id="acme")
        flaky = await client.enqueue("fetch", {"kind": "os"}, org_id="acme")
        for job_id in (other.id, flaky.id):
            await wait_status(db, job_id, "failed")

    assert (await events_of(db, other.id))[1:] == [
        ("queued", "running", 1, None),
        ("running", "failed", 1, "handler error"),
    ]
    assert (await events_of(db, flaky.id))[1:] == [
        ("queued", "running", 1, None),
        ("running", "scheduled", 1, "retry"),
        ("scheduled", "queued", 1, "due"),
        ("queued", "running", 2, None),
        ("running", "failed", 2, "handler error"),
    ]
    await assert_history_complete_async(db)


async def test_a_timeout_is_retried_when_the_policy_names_timeout_error(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler(
        "slow",
        timeout=0.1,
        retry=jobsd.RetryPolicy(2, backoff=0.0, retry_on=(TimeoutError,)),
        registry=registry,
    )
    async def slow(ctx: jobsd.JobContext) -> None:
        if ctx.attempt == 1:
            await anyio.sleep(30)

    async with running_daemon(make_settings(db_url, **SETTINGS), registry):
        job = await client.enqueue("slow", {}, org_id="acme")
        await wait_status(db, job.id, "succeeded", "failed")
    assert (await events_of(db, job.id))[2] == ("running", "scheduled", 1, "retry")
    assert (await fetch_job(db, job.id))["status"] == "succeeded"


async def test_a_retry_runs_when_due_without_waiting_for_the_next_poll(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler(
        "flaky", retry=jobsd.RetryPolicy(2, backoff=0.3, retry_on=(OSError,)), registry=registry
    )
    async def flaky(ctx: jobsd.JobContext) -> dict[str, int]:
        if ctx.attempt == 1:
            await anyio.sleep(0.2)  # work: the claimer is asleep by the time this fails
            raise ConnectionResetError("once")
        return {"attempt": ctx.attempt}

    # a 30 s poll: only the completer's local wake-up can bring the retry back in time
    async with running_daemon(make_settings(db_url, poll_interval=30), registry):
        job = await client.enqueue("flaky", {}, org_id="acme")
        done = await wait_status(db, job.id, "succeeded", "failed", timeout_s=5.0)

    assert done["status"] == "succeeded"
    cur = await db.execute(
        "SELECT to_status, at FROM jobsd.all_job_events WHERE job_id = %s ORDER BY id", (job.id,)
    )
    at = {r["to_status"]: r["at"] for r in await cur.fetchall()}
    # due at run_after, the failure's now() + 0.3 s; the events' clock_timestamp() reads a
    # little after now(), so "not before due" is checked against run_after itself
    due = (done["run_after"] - at["scheduled"]).total_seconds()
    assert 0.1 < due <= 0.3, f"due {due:.3f} s after the retry was scheduled"
    assert at["queued"] >= done["run_after"], "promoted before it was due"
    waited = (at["queued"] - at["scheduled"]).total_seconds()
    assert waited < 2.0, f"promoted {waited:.2f} s after the retry was scheduled"
    await assert_history_complete_async(db)
