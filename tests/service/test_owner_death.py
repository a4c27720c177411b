"""Owner death proven by a lock, and what a rescue does per delivery mode."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.registry import Registry

from .conftest import ADb, events_of, fetch_job, make_settings, running_daemon, wait_until
from .test_sweeper import DEAD, make_zombie

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

ALIVE = "alive-host:4343:fedcba"


def register(registry: Registry) -> None:
    """Declare one type per delivery mode, both allowing 3 attempts."""

    @jobsd.handler("again", max_attempts=3, registry=registry)
    async def again(ctx: jobsd.JobContext) -> None:
        return None

    @jobsd.handler("once", max_attempts=3, delivery="at_most_once", registry=registry)
    async def once(ctx: jobsd.JobContext) -> None:
        return None


async def worker_ids(db: ADb) -> list[str]:
    cur = await db.execute("SELECT worker_id FROM jobsd.workers ORDER BY worker_id")
    return [r["worker_id"] for r in await cur.fetchall()]


async def add_worker(db: ADb, worker_id: str) -> None:
    await db.execute(
        "INSERT INTO jobsd.workers (worker_id, hostname, pid) VALUES (%s, 'h', 1)", (worker_id,)
    )


async def test_a_worker_whose_lock_is_free_is_dead_and_its_jobs_are_rescued_at_once(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    register(registry)
    # a fresh heartbeat: only the lock can tell that the owner is gone
    again = await make_zombie(db, client, "again", attempts=1, heartbeat_age_s=0)
    once = await make_zombie(db, client, "once", attempts=1, heartbeat_age_s=0)
    await add_worker(db, DEAD)
    settings = make_settings(db_url, death_check_interval=3600)
    async with running_daemon(settings, registry) as daemon:
        # the daemon's start-up pass may get there first (holding the dead worker's lock
        # while it works): either way, a pass does it
        async def forgotten() -> bool:
            await daemon.sweeper.check_deaths()
            return await worker_ids(db) == [settings.worker_id]

        await wait_until(forgotten, what="the dead worker to be rescued")
        assert await daemon.sweeper.check_deaths() == {}
        assert daemon.stats.swept == {"queued": 1, "failed": 1}

    assert (await events_of(db, again))[2] == ("running", "queued", 1, "owner died")
    lost = await fetch_job(db, once)
    assert (lost["status"], lost["reason"], lost["error"]) == (
        "failed",
        "worker lost",
        "worker lost: owner died at attempt 1",
    )
    assert lost["lease_id"] is None
    await assert_history_complete_async(db)


async def test_a_worker_holding_its_lock_is_alive_and_keeps_its_jobs(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    register(registry)
    job = await make_zombie(db, client, "again", attempts=1, heartbeat_age_s=0)
    await db.execute("UPDATE jobsd.jobs SET worker_id = %s WHERE id = %s", (ALIVE, job))
    await add_worker(db, ALIVE)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as owner:
        await owner.execute("SELECT pg_advisory_lock(jobsd.worker_lock_key(%s))", (ALIVE,))
        settings = make_settings(db_url, death_check_interval=3600)
        async with running_daemon(settings, registry) as daemon:
            assert await daemon.sweeper.check_deaths() == {}
            assert (await fetch_job(db, job))["status"] == "running"
            assert await worker_ids(db) == sorted([ALIVE, settings.worker_id])
            # the owner's session ends (the server lets go of its locks a moment later)
            await owner.close()

            async def rescued() -> bool:
                await daemon.sweeper.check_deaths()
                return await worker_ids(db) == [settings.worker_id]

            await wait_until(rescued, what="the death to be noticed")
            assert (await events_of(db, job))[2] == ("running", "queued", 1, "owner died")


async def test_the_daemon_registers_with_its_lock_and_deregisters_on_stop(
    db_url: str, db: ADb, registry: Registry
) -> None:
    settings = make_settings(db_url)
    async with running_daemon(settings, registry):
        cur = await db.execute("SELECT worker_id, pid FROM jobsd.workers")
        rows = await cur.fetchall()
        assert [r["worker_id"] for r in rows] == [settings.worker_id]
        cur = await db.execute(
            "SELECT pg_try_advisory_lock(jobsd.worker_lock_key(%s)) AS free",
            (settings.worker_id,),
        )
        assert await cur.fetchone() == {"free": False}, "the daemon holds its lock"
    cur = await db.execute("SELECT count(*) AS n FROM jobsd.workers")
    assert await cur.fetchone() == {"n": 0}


async def test_a_stale_at_most_once_job_fails_as_worker_lost_whatever_its_attempts(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    register(registry)
    once = await make_zombie(db, client, "once", attempts=1, heartbeat_age_s=500)
    again = await make_zombie(db, client, "again", attempts=3, heartbeat_age_s=500)
    async with running_daemon(make_settings(db_url, stale_after=600), registry) as daemon:
        later = datetime.now(UTC) + timedelta(seconds=200)
        assert await daemon.sweeper.sweep_stale(now=later) == {"failed": 2}
    assert (await events_of(db, once))[-1] == ("running", "failed", 1, "worker lost")
    # the cause survives exhaustion: which, at which attempt of how many
    assert (await events_of(db, again))[-1] == (
        "running",
        "failed",
        3,
        "max attempts exceeded: owner unresponsive at attempt 3 of 3",
    )
    await assert_history_complete_async(db)


async def test_a_lost_lifeline_connection_is_reopened_and_the_worker_registers_again(
    db_url: str, db: ADb, registry: Registry
) -> None:
    settings = make_settings(db_url, death_check_interval=0.1)
    async with running_daemon(settings, registry) as daemon:
        assert daemon.lifeline.registrations == 1
        await db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'jobsd-lifeline' AND datname = current_database()"
        )

        async def registered_again() -> bool:
            return daemon.lifeline.registrations == 2 and daemon.lifeline.registered

        await wait_until(registered_again, what="the lifeline to register again")
        assert await worker_ids(db) == [settings.worker_id]
        cur = await db.execute(
            "SELECT pg_try_advisory_lock(jobsd.worker_lock_key(%s)) AS free",
            (settings.worker_id,),
        )
        assert await cur.fetchone() == {"free": False}, "the lock is held again"
