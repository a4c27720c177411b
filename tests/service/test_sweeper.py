"""Zombies: running jobs of a dead worker are requeued, or failed for good at the cap."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.models import Job
from jobsd.registry import Registry

from .conftest import ADb, events_of, fetch_job, make_settings, running_daemon, wait_status

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

DEAD = "dead-host:4242:abcdef"


async def make_zombie(
    db: ADb,
    client: jobsd.Client,
    type: str,
    *,
    attempts: int,
    heartbeat_age_s: float,
    progress: dict[str, Any] | None = None,
) -> uuid.UUID:
    """Create a job that a now-dead worker claimed ``attempts`` times, the last one still open.

    Earlier attempts went through the same transitions a sweeper makes, so the history is
    what a real zombie would leave behind.
    """
    job = await client.enqueue(type, {"rows": 100}, org_id="acme")
    for attempt in range(1, attempts + 1):
        await db.execute(
            "UPDATE jobsd.jobs SET status = 'running', attempts = %(attempt)s, "
            "started_at = now() - make_interval(secs => %(age)s), "
            "lease_id = gen_random_uuid(), worker_id = %(worker)s, reason = NULL, "
            "progress = %(progress)s::jsonb "
            "|| jsonb_build_object('updated_at', now() - make_interval(secs => %(age)s)) "
            "WHERE id = %(id)s",
            {
                "id": job.id,
                "attempt": attempt,
                "age": heartbeat_age_s,
                "worker": DEAD,
                "progress": json.dumps(progress or {}),
            },
        )
        if attempt < attempts:
            await db.execute(
                "UPDATE jobsd.jobs SET status = 'queued', reason = 'owner unresponsive', "
                "lease_id = NULL WHERE id = %s",
                (job.id,),
            )
    return job.id


async def test_zombie_is_requeued_and_runs_again_from_its_checkpoint(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    seen: list[tuple[int, dict[str, Any]]] = []

    @jobsd.handler("import_csv", max_attempts=3, registry=registry)
    async def import_csv(ctx: jobsd.JobContext) -> dict[str, int]:
        seen.append((ctx.attempt, dict(ctx.checkpoint)))
        resumed_from = ctx.checkpoint.get("done", 0)
        await ctx.progress(done=ctx.payload["rows"], total=ctx.payload["rows"])
        return {"resumed_from": resumed_from}

    # the heartbeat is 500 s old: under the 600 s threshold of the start-up sweep
    zombie = await make_zombie(
        db, client, "import_csv", attempts=1, heartbeat_age_s=500, progress={"done": 40}
    )
    async with running_daemon(make_settings(db_url, stale_after=600), registry) as daemon:
        # 200 s later (pinned clock) the owner is taken for dead
        later = datetime.now(UTC) + timedelta(seconds=200)
        counts = await daemon.sweeper.run_once(now=later)
        assert counts == {"queued": 1}
        done = await wait_status(db, zombie, "succeeded", "failed")
        # repeating the pass finds nothing more to do
        assert await daemon.sweeper.run_once(now=later) == {}

    assert done["status"] == "succeeded"
    assert done["attempts"] == 2
    assert done["worker_id"] == daemon.settings.worker_id
    assert seen == [(2, {"done": 40})]
    assert done["report"] == {"resumed_from": 40}
    assert done["progress"]["done"] == 100
    history = await events_of(db, zombie)
    assert history[-3:] == [
        ("running", "queued", 1, "owner unresponsive"),
        ("queued", "running", 2, None),
        ("running", "succeeded", 2, None),
    ]
    cur = await db.execute(
        "SELECT worker_id FROM jobsd.all_job_events WHERE job_id = %s "
        "ORDER BY id DESC OFFSET 2 LIMIT 1",
        (zombie,),
    )
    rescuer = await cur.fetchone()
    assert rescuer == {"worker_id": daemon.settings.worker_id}, "the rescue names its actor"
    await assert_history_complete_async(db)


async def test_zombie_at_the_cap_fails_for_good_and_the_queue_goes_on(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    failed: list[Job] = []
    hook_called = anyio.Event()

    def on_fail(job: Job) -> None:
        failed.append(job)
        hook_called.set()

    @jobsd.handler("import_csv", max_attempts=3, on_fail=on_fail, registry=registry)
    async def import_csv(ctx: jobsd.JobContext) -> dict[str, int]:
        return {"attempt": ctx.attempt}

    capped = await make_zombie(db, client, "import_csv", attempts=3, heartbeat_age_s=500)
    unknown = await make_zombie(db, client, "not_registered", attempts=1, heartbeat_age_s=500)
    waiting = await client.enqueue("import_csv", {"rows": 1}, org_id="acme")

    async with running_daemon(make_settings(db_url, slots=1), registry) as daemon:
        # 200 s later (pinned clock): the zombies are stale, this daemon's own job is not
        counts = await daemon.sweeper.run_once(now=datetime.now(UTC) + timedelta(seconds=200))
        assert counts == {"failed": 2}
        with anyio.fail_after(5):
            await hook_called.wait()
        # the queue goes on: the job that waited, and one enqueued after the sweep
        after = await client.enqueue("import_csv", {"rows": 1}, org_id="acme")
        for job_id in (waiting.id, after.id):
            assert (await wait_status(db, job_id, "succeeded", "failed"))["status"] == "succeeded"

    dead = await fetch_job(db, capped)
    assert dead["status"] == "failed"
    exhausted = "max attempts exceeded: owner unresponsive at attempt 3 of 3"
    assert (dead["error"], dead["reason"]) == (exhausted, exhausted)
    assert dead["attempts"] == 3
    assert dead["lease_id"] is None
    assert dead["finished_at"] is not None
    assert [j.id for j in failed] == [capped], "on_fail runs once, for the registered type"
    assert failed[0].status == "failed"
    assert failed[0].error == exhausted
    # a type nobody registered gets the default max_attempts (1)
    assert (await fetch_job(db, unknown))["status"] == "failed"
    assert (await events_of(db, capped))[-1] == ("running", "failed", 3, exhausted)
    await assert_history_complete_async(db)
