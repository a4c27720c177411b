"""Progress, heartbeats and leases: throttled writes, proof of life, checkpoints, and a
worker that lost its lease can no longer report."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.registry import Registry

from .conftest import (
    ADb,
    events_of,
    fetch_job,
    make_settings,
    running_daemon,
    wait_status,
    wait_until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

CALLS = 10_000


async def log_updates(db: ADb) -> None:
    """Record every UPDATE of a jobs row in a side table (an exact count, no stats lag)."""
    await db.execute(
        """
        CREATE TABLE job_updates (n bigserial PRIMARY KEY, job_id uuid, status text,
                                  progress jsonb);
        CREATE FUNCTION log_job_update() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          INSERT INTO job_updates (job_id, status, progress)
          VALUES (NEW.id, NEW.status, NEW.progress);
          RETURN NULL;
        END $$;
        CREATE TRIGGER log_job_update AFTER UPDATE ON jobsd.jobs
          FOR EACH ROW EXECUTE FUNCTION log_job_update();
        """
    )


async def test_ten_thousand_progress_calls_make_a_handful_of_updates(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler("import_csv", registry=registry)
    async def import_csv(ctx: jobsd.JobContext) -> dict[str, int]:
        for done in range(1, CALLS + 1):
            await ctx.progress(done=done, total=CALLS)
            if done % 200 == 0:
                await anyio.sleep(0.02)  # the work: ~1 s in all, about ten write intervals
        return {"rows": CALLS}

    await log_updates(db)
    settings = make_settings(db_url, progress_interval=0.1, heartbeat_interval=0.3)
    async with running_daemon(settings, registry):
        job = await client.enqueue("import_csv", {}, org_id="acme")
        row = await wait_status(db, job.id, "succeeded", "failed")

    assert row["status"] == "succeeded"
    assert row["progress"]["done"] == CALLS, "the last progress is written with the outcome"
    cur = await db.execute(
        "SELECT status, (progress ->> 'done')::int AS done FROM job_updates "
        "WHERE job_id = %s ORDER BY n",
        (job.id,),
    )
    updates = await cur.fetchall()
    # claim + ~10 progress ticks + the outcome, give or take a tick
    assert len(updates) <= 25, f"{len(updates)} UPDATEs for {CALLS} progress calls"
    seen = [u["done"] for u in updates if u["status"] == "running" and u["done"] is not None]
    assert len(seen) >= 3, f"progress was not written while the job ran: {seen}"
    assert seen == sorted(seen)
    assert 0 < seen[0] < CALLS
    await assert_history_complete_async(db)


async def test_progress_updated_at_is_the_handler_s_and_never_the_daemon_s(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    quiet_for_a_while = anyio.Event()
    release = anyio.Event()

    @jobsd.handler("quiet", registry=registry)
    async def quiet(ctx: jobsd.JobContext) -> None:
        await quiet_for_a_while.wait()  # silent: the daemon's checks write nothing
        ctx.progress(done=1)
        await release.wait()

    settings = make_settings(db_url, heartbeat_interval=0.1)
    async with running_daemon(settings, registry) as daemon:
        job = await client.enqueue("quiet", {}, org_id="acme")
        running = await wait_status(db, job.id, "running")
        beats = daemon.heartbeat.beats

        async def checked_three_times() -> bool:
            return daemon.heartbeat.beats >= beats + 3

        await wait_until(checked_three_times, what="three checks of the running job")
        assert (await fetch_job(db, job.id))["progress"] is None
        quiet_for_a_while.set()

        async def stamp() -> datetime | None:
            progress = (await fetch_job(db, job.id))["progress"] or {}
            value = progress.get("updated_at")
            return datetime.fromisoformat(value) if value else None

        first = await wait_until(stamp, what="the handler's progress")
        release.set()
        done = await wait_status(db, job.id, "succeeded")

    assert running["started_at"] <= first
    assert done["progress"] == {"done": 1, "updated_at": done["progress"]["updated_at"]}
    await assert_history_complete_async(db)


async def test_lease_taken_underneath_cancels_the_handler_and_discards_its_result(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    started = anyio.Event()
    cancelled = anyio.Event()

    @jobsd.handler("long", registry=registry)
    async def long(ctx: jobsd.JobContext) -> dict[str, str]:
        started.set()
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise
        return {"wrote": "too late"}

    thief_lease = uuid.uuid4()
    async with running_daemon(make_settings(db_url, heartbeat_interval=0.1), registry) as daemon:
        job = await client.enqueue("long", {}, org_id="acme")
        with anyio.fail_after(5):
            await started.wait()
        # another worker now owns the job (what a sweep and a re-claim elsewhere do)
        await db.execute(
            "UPDATE jobsd.jobs SET lease_id = %s, worker_id = 'thief' WHERE id = %s",
            (thief_lease, job.id),
        )
        with anyio.fail_after(5):
            await cancelled.wait()

        async def discarded() -> bool:
            return daemon.stats.discarded == 1 and len(daemon.holdings) == 0

        await wait_until(discarded, what="the lost job's result to be discarded")
        assert daemon.holdings.free == daemon.settings.slots

    row = await fetch_job(db, job.id)
    assert row["status"] == "running", "the row keeps the new owner's state"
    assert row["lease_id"] == thief_lease
    assert row["worker_id"] == "thief"
    assert row["report"] is None
    assert row["error"] is None
    assert daemon.stats.finished == {}
    await assert_history_complete_async(db)


async def test_a_job_swept_and_reclaimed_by_the_same_daemon_keeps_one_owner(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    """The old run is stopped, its result discarded, and the new run alone reports.

    The old run held the job under lease 1; a sweep requeued it and this very daemon
    claimed it again under lease 2 while the old handler was still running.
    """
    trace: list[str] = []
    gates = {1: anyio.Event(), 2: anyio.Event()}

    @jobsd.handler("import_csv", max_attempts=3, registry=registry)
    async def import_csv(ctx: jobsd.JobContext) -> dict[str, Any]:
        trace.append(f"start {ctx.attempt}")
        resumed_from = ctx.checkpoint.get("done", 0)
        if ctx.attempt == 1:
            await ctx.progress(done=30, total=100)
        try:
            await gates[ctx.attempt].wait()
        except anyio.get_cancelled_exc_class():
            trace.append(f"cancelled {ctx.attempt}")
            raise
        trace.append(f"end {ctx.attempt}")
        return {"attempt": ctx.attempt, "resumed_from": resumed_from}

    settings = make_settings(db_url, slots=2, heartbeat_interval=0.1, stale_after=600)
    async with running_daemon(settings, registry) as daemon:
        job = await client.enqueue("import_csv", {}, org_id="acme")

        async def checkpointed() -> bool:
            return ((await fetch_job(db, job.id))["progress"] or {}).get("done") == 30

        await wait_until(checkpointed, what="the first attempt's checkpoint")
        # the daemon looks dead to a sweep 11 minutes from now
        later = datetime.now(UTC) + timedelta(minutes=11)
        assert await daemon.sweeper.run_once(now=later) == {"queued": 1}

        async def second_started() -> bool:
            return "start 2" in trace

        await wait_until(second_started, what="the second attempt")

        async def first_stopped() -> bool:
            return "cancelled 1" in trace and daemon.stats.discarded == 1

        await wait_until(first_stopped, what="the first attempt to be cancelled and discarded")
        # the new run is still held under its own lease
        lease_2 = (await fetch_job(db, job.id))["lease_id"]
        assert [h.lease_id for h in daemon.holdings] == [lease_2]

        beats = daemon.heartbeat.beats

        async def checked_after_discard() -> bool:
            return daemon.heartbeat.beats >= beats + 2

        await wait_until(checked_after_discard, what="two checks of the second attempt")
        # checked under its own lease, it kept it
        assert [(h.lease_id, h.lost) for h in daemon.holdings] == [(lease_2, False)]
        gates[2].set()
        row = await wait_status(db, job.id, "succeeded", "failed")

    # the old run is stopped by the heartbeat or by the new claim, whichever comes first
    assert trace[0] == "start 1"
    assert sorted(trace[1:3]) == ["cancelled 1", "start 2"]
    assert trace[3:] == ["end 2"]
    assert row["status"] == "succeeded"
    assert row["report"] == {"attempt": 2, "resumed_from": 30}
    assert row["attempts"] == 2
    assert daemon.stats.discarded == 1
    history = await events_of(db, job.id)
    # the first run's result, discarded, leaves a note (not a transition), in the
    # state the job was in then: queued again, or already running its second attempt
    notes = [e for e in history if e[0] == e[1]]
    assert len(notes) == 1 and notes[0][3] == "result discarded: lease lost"
    assert [e for e in history if e[0] != e[1]][1:] == [
        ("queued", "running", 1, None),
        ("running", "queued", 1, "owner unresponsive"),
        ("queued", "running", 2, None),
        ("running", "succeeded", 2, None),
    ]
    await assert_history_complete_async(db)


async def test_progress_taken_by_a_heartbeat_in_flight_is_written_when_the_job_ends_first(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    """The last progress reaches the row even if the heartbeat carrying it lands too late."""

    @jobsd.handler("import_csv", registry=registry)
    async def import_csv(ctx: jobsd.JobContext) -> dict[str, bool]:
        await ctx.progress(done=7, total=7)

        async def taken() -> bool:
            return not ctx.has_pending

        await wait_until(taken, what="a heartbeat to take the progress", timeout_s=5)
        return {"ok": True}

    # hold every heartbeat statement for 300 ms before it touches a row, so the outcome
    # write (which never waits) commits first and the heartbeat finds the job ended
    await db.execute(
        """
        CREATE FUNCTION slow_heartbeat() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF current_query() LIKE '%jsonb_build_object(''updated_at''%' THEN
            PERFORM pg_sleep(0.3);
          END IF;
          RETURN NULL;
        END $$;
        CREATE TRIGGER slow_heartbeat BEFORE UPDATE ON jobsd.jobs
          FOR EACH STATEMENT EXECUTE FUNCTION slow_heartbeat();
        """
    )
    async with running_daemon(make_settings(db_url), registry):
        job = await client.enqueue("import_csv", {}, org_id="acme")
        row = await wait_status(db, job.id, "succeeded", "failed")

    assert row["status"] == "succeeded"
    assert row["progress"]["done"] == 7
    assert row["progress"]["total"] == 7
    await assert_history_complete_async(db)
