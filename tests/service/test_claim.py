"""Exclusive claim: two daemons on one database never run a job twice."""

from __future__ import annotations

import pytest
from psycopg_pool import AsyncConnectionPool
from support.history import assert_history_complete_async

import jobsd
from jobsd.client import JobSpec
from jobsd.registry import Registry

from .conftest import ADb, make_settings, running_daemon, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

JOBS = 300


@pytest.mark.slow
async def test_two_daemons_claim_each_job_exactly_once(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    await db.execute("CREATE TABLE side (job_id uuid PRIMARY KEY, runs_seen int NOT NULL)")
    async with AsyncConnectionPool(db_url, min_size=2, max_size=8, open=False) as side_pool:

        @jobsd.handler("touch", registry=registry)
        async def touch(ctx: jobsd.JobContext) -> dict[str, int]:
            # a second run of the same job violates the primary key and fails the job
            async with side_pool.connection() as conn:
                await conn.execute(
                    "INSERT INTO side (job_id, runs_seen) VALUES (%s, %s)", (ctx.id, ctx.attempt)
                )
            return {"attempt": ctx.attempt}

        async with (
            running_daemon(make_settings(db_url, slots=5), registry) as one,
            running_daemon(make_settings(db_url, slots=5), registry) as two,
        ):
            # half in one bulk statement (one NOTIFY wakes both), half one by one
            specs = [JobSpec.build("touch", {"n": n}, org_id="acme") for n in range(JOBS // 2)]
            await client.enqueue_many(specs)
            for n in range(JOBS // 2, JOBS):
                await client.enqueue("touch", {"n": n}, org_id="acme")

            async def all_done() -> bool:
                cur = await db.execute(
                    "SELECT count(*) AS n FROM jobsd.jobs WHERE status IN ('succeeded', 'failed')"
                )
                row = await cur.fetchone()
                return row is not None and row["n"] == JOBS

            await wait_until(all_done, what=f"{JOBS} jobs to finish", timeout_s=45)

    cur = await db.execute(
        "SELECT status, attempts, count(*) AS n FROM jobsd.jobs GROUP BY status, attempts"
    )
    assert {(r["status"], r["attempts"]): r["n"] for r in await cur.fetchall()} == {
        ("succeeded", 1): JOBS
    }
    cur = await db.execute(
        "SELECT count(*) AS n, count(DISTINCT s.job_id) AS jobs FROM side s "
        "JOIN jobsd.jobs j ON j.id = s.job_id"
    )
    assert await cur.fetchone() == {"n": JOBS, "jobs": JOBS}
    # every job was claimed once, by one of the two daemons, and both did work
    cur = await db.execute(
        "SELECT count(*) AS n FROM jobsd.all_job_events WHERE to_status = 'running'"
    )
    assert await cur.fetchone() == {"n": JOBS}
    claimed = [sum(one.stats.claimed.values()), sum(two.stats.claimed.values())]
    assert sum(claimed) == JOBS
    assert min(claimed) > 0, f"one daemon took every job: {claimed}"
    cur = await db.execute("SELECT worker_id, count(*) AS n FROM jobsd.jobs GROUP BY worker_id")
    by_worker = {r["worker_id"]: r["n"] for r in await cur.fetchall()}
    assert by_worker == {
        one.settings.worker_id: claimed[0],
        two.settings.worker_id: claimed[1],
    }
    await assert_history_complete_async(db)


async def test_a_round_that_fills_every_slot_claims_again_without_waiting_for_a_wake_up(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler("noop", registry=registry)
    async def noop(ctx: jobsd.JobContext) -> None:
        return None

    await client.enqueue_many([JobSpec.build("noop", {}, org_id="acme") for _ in range(40)])
    # no NOTIFY and a 30 s poll: only back-to-back claim rounds can drain the queue quickly
    # (rounds for free slots only: claiming ahead has its own tests)
    settings = make_settings(db_url, slots=4, claim_ahead=0, notify=False, poll_interval=30.0)
    async with running_daemon(settings, registry) as daemon:

        async def drained() -> bool:
            cur = await db.execute(
                "SELECT count(*) AS n FROM jobsd.jobs WHERE status = 'succeeded'"
            )
            row = await cur.fetchone()
            return row is not None and row["n"] == 40

        await wait_until(drained, what="40 jobs to run back to back", timeout_s=5)

    assert daemon.stats.wakeups["more"] >= 10
    assert daemon.stats.wakeups["poll"] == 0
    assert daemon.stats.wakeups["notify"] == 0
    await assert_history_complete_async(db)
