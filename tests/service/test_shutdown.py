"""Graceful stop: outcomes in flight are written exactly once; jobs still running past the
drain timeout are written back."""

from __future__ import annotations

import anyio
import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.registry import Registry

from .conftest import ADb, events_of, fetch_job, make_settings, running_daemon, wait_status

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_an_outcome_being_written_at_stop_is_written_once(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    returned = anyio.Event()

    @jobsd.handler("quick", registry=registry)
    async def quick(ctx: jobsd.JobContext) -> dict[str, bool]:
        returned.set()
        return {"ok": True}

    # every outcome write takes 300 ms: the stop lands while it is in flight
    await db.execute(
        """
        CREATE FUNCTION slow_finish() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$;
        CREATE TRIGGER slow_finish BEFORE UPDATE ON jobsd.jobs FOR EACH ROW
          WHEN (NEW.status = 'succeeded') EXECUTE FUNCTION slow_finish();
        """
    )
    async with running_daemon(make_settings(db_url), registry) as daemon:
        job = await client.enqueue("quick", {}, org_id="acme")
        with anyio.fail_after(5):
            await returned.wait()

    assert (await fetch_job(db, job.id))["status"] == "succeeded"
    assert daemon.stats.finished == {("quick", "succeeded"): 1}
    assert daemon.stats.discarded == 0, "a written outcome was also reported as discarded"
    assert daemon.completer.pending == 0
    await assert_history_complete_async(db)


async def test_jobs_still_running_after_the_drain_timeout_are_written_back(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler("resumable", max_attempts=3, registry=registry)
    async def resumable(ctx: jobsd.JobContext) -> None:
        await ctx.progress(done=5)
        await anyio.sleep(60)

    @jobsd.handler("once", registry=registry)
    async def once(ctx: jobsd.JobContext) -> None:
        await anyio.sleep(60)

    # attempts remain, but an interrupted run's outcome is unknown: never run it again
    @jobsd.handler("publish", max_attempts=3, delivery="at_most_once", registry=registry)
    async def publish(ctx: jobsd.JobContext) -> None:
        await anyio.sleep(60)

    settings = make_settings(db_url, drain_timeout=0.3)
    async with running_daemon(settings, registry) as daemon:
        again = await client.enqueue("resumable", {}, org_id="acme")
        gone = await client.enqueue("once", {}, org_id="acme")
        published = await client.enqueue("publish", {}, org_id="acme")
        for job in (again, gone, published):
            await wait_status(db, job.id, "running")
    assert daemon.holdings.running == 0
    assert (await fetch_job(db, published.id))["status"] == "failed"
    assert (await events_of(db, published.id))[-1] == ("running", "failed", 1, "shutdown")

    requeued = await fetch_job(db, again.id)
    # queued again (the run's lease stays on the row, but only a running row takes a
    # worker's write, and the next claim writes a new lease)
    assert requeued["status"] == "queued" and requeued["reserved_until"] is None
    assert requeued["progress"]["done"] == 5, "the checkpoint is kept for the next attempt"
    failed = await fetch_job(db, gone.id)
    assert failed["status"] == "failed"
    assert failed["reason"] == "shutdown"
    assert (await events_of(db, again.id))[-1] == ("running", "queued", 1, "shutdown")
    assert (await events_of(db, gone.id))[-1] == ("running", "failed", 1, "shutdown")
    await assert_history_complete_async(db)


async def test_a_late_second_sigint_while_the_pool_closes_is_handled_not_raised(
    db_url: str, registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    """``uv run`` forwards the terminal's Ctrl-C to its child, which got it already: the
    second SIGINT may land after the stop has begun, while the last connections close.
    The daemon's signal handling lasts until ``run`` returns (before, the default
    handler raised KeyboardInterrupt there: `uv run jobsd dev`, Ctrl-C, a traceback)."""
    import os
    import signal

    from support.waiting import wait_until

    from jobsd.worker.supervisor import Daemon

    def signals_logged() -> int:
        return sum(r.getMessage() == "daemon.signal" for r in caplog.records)

    caplog.set_level("INFO", logger="jobsd.worker.supervisor")
    daemon = Daemon(make_settings(db_url), registry)
    close = daemon.pool.close

    async def close_after_a_late_sigint() -> None:
        os.kill(os.getpid(), signal.SIGINT)

        async def two() -> bool:
            return signals_logged() >= 2

        await wait_until(two, what="the late SIGINT to reach the daemon's handler")
        await close()

    daemon.pool.close = close_after_a_late_sigint  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(daemon.run)
        with anyio.fail_after(15):
            await daemon.ready.wait()
        os.kill(os.getpid(), signal.SIGINT)  # the first: a graceful stop
    assert daemon.stopping and signals_logged() == 2
    assert daemon.pool.closed
