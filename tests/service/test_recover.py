"""Recovery after an ambiguous end (seed 001): an at_most_once type's recover hook
settles a job whose owner died; an operator resolves what the hook cannot."""

from __future__ import annotations

import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.models import Job
from jobsd.recovery import AMBIGUOUS, RERUN, Recovery, succeeded
from jobsd.registry import Registry
from jobsd.store import queries

from .conftest import ADb, events_of, fetch_job, make_settings, running_daemon, wait_status
from .test_owner_death import add_worker
from .test_sweeper import DEAD, make_zombie

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def publish_type(registry: Registry, answers: dict[str, Recovery], ran: list[int]) -> None:
    async def recover(job: Job) -> Recovery:
        return answers[job.payload["case"]] if "case" in job.payload else AMBIGUOUS

    @jobsd.handler(
        "publish", delivery="at_most_once", max_attempts=2, recover=recover, registry=registry
    )
    async def publish(ctx: jobsd.JobContext) -> dict[str, int]:
        ran.append(ctx.attempt)
        return {"published_on_attempt": ctx.attempt}


async def zombie(db: ADb, client: jobsd.Client, case: str) -> object:
    job = await client.enqueue("publish", {"case": case}, org_id="acme")
    await db.execute(
        "UPDATE jobsd.jobs SET status = 'running', attempts = 1, started_at = now(), "
        "lease_id = gen_random_uuid(), worker_id = %s WHERE id = %s",
        (DEAD, job.id),
    )
    return job.id


async def test_the_recover_hook_decides_succeeded_ambiguous_or_rerun(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    ran: list[int] = []
    answers = {"done": succeeded({"message_id": 7}), "unsure": AMBIGUOUS, "again": RERUN}
    publish_type(registry, answers, ran)
    ids = {case: await zombie(db, client, case) for case in answers}
    await add_worker(db, DEAD)
    async with running_daemon(make_settings(db_url), registry) as daemon:
        await daemon.sweeper.check_deaths()
        # whichever pass took the dead worker (this one or the start-up one) settles all
        again = await wait_status(db, ids["again"], "succeeded", "failed")  # type: ignore[arg-type]
        await wait_status(db, ids["done"], "succeeded")  # type: ignore[arg-type]

    done = await fetch_job(db, ids["done"])  # type: ignore[arg-type]
    assert (done["status"], done["reason"]) == ("succeeded", "recovered_after_publish")
    assert done["report"] == {"message_id": 7}
    assert (await events_of(db, ids["done"]))[-2:] == [  # type: ignore[arg-type]
        ("running", "recovery_required", 1, "worker lost"),
        ("recovery_required", "succeeded", 1, "recovered_after_publish"),
    ]
    unsure = await fetch_job(db, ids["unsure"])  # type: ignore[arg-type]
    assert unsure["status"] == "recovery_required"
    assert again["status"] == "succeeded" and again["attempts"] == 2
    assert ran == [2], "only the rerun ran again; the others never ran twice"
    assert (await events_of(db, ids["again"]))[2:4] == [  # type: ignore[arg-type]
        ("running", "recovery_required", 1, "worker lost"),
        ("recovery_required", "queued", 1, "recovered: rerun"),
    ]

    # the operator settles the ambiguous one; resolving twice does nothing
    resolved = await queries.resolve_job(
        db,
        unsure["id"],
        status="failed",
        reason="resolved by operator",
        actor="ops",
        error="not published",
    )
    assert resolved is not None and resolved.status == "failed"
    assert resolved.error == "not published"
    assert (
        await queries.resolve_job(db, unsure["id"], status="succeeded", reason="x", actor="ops")
        is None
    )
    await assert_history_complete_async(db)


async def test_a_failing_hook_leaves_the_job_for_an_operator(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    def recover(job: Job) -> Recovery:
        raise RuntimeError("cannot reach the broker")

    @jobsd.handler("publish", delivery="at_most_once", recover=recover, registry=registry)
    async def publish(ctx: jobsd.JobContext) -> None:
        raise AssertionError("must not run again")

    job = await make_zombie(db, client, "publish", attempts=1, heartbeat_age_s=0)
    await add_worker(db, DEAD)
    async with running_daemon(make_settings(db_url), registry) as daemon:
        await daemon.sweeper.check_deaths()
        row = await wait_status(db, job, "recovery_required")
    assert row["reason"] == "worker lost"
    await assert_history_complete_async(db)


async def test_a_dead_owners_at_most_once_job_with_a_cancel_pending_asks_the_hook_first(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    # the run may have published before its owner died: the hook says; its rerun means
    # "not done", and the user asked for it to stop: cancelled
    ran: list[int] = []
    publish_type(registry, {"again": RERUN, "done": succeeded({"id": 1})}, ran)
    ids = {case: await zombie(db, client, case) for case in ("again", "done")}
    await db.execute(
        "UPDATE jobsd.jobs SET cancel_requested_at = now() WHERE id = ANY(%s)",
        (list(ids.values()),),
    )
    await add_worker(db, DEAD)
    async with running_daemon(make_settings(db_url), registry) as daemon:
        await daemon.sweeper.check_deaths()
        again = await wait_status(db, ids["again"], "cancelled")  # type: ignore[arg-type]
        done = await wait_status(db, ids["done"], "succeeded")  # type: ignore[arg-type]
    assert ran == []
    assert (await events_of(db, ids["again"]))[-2:] == [  # type: ignore[arg-type]
        ("running", "recovery_required", 1, "cancel requested"),
        ("recovery_required", "cancelled", 1, "cancel requested"),
    ]
    assert again["error"] == "cancelled while running: outcome unknown"
    assert done["reason"] == "recovered_after_publish"
    await assert_history_complete_async(db)
