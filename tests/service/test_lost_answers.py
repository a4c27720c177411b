"""A claim or a start whose answer never reaches the daemon: it committed, the
connection broke. The daemon finds out what it owns and runs it; nothing waits for the
stale sweep, nothing fails without a run, nothing is charged twice."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import anyio
import pytest
from faults.proxy import Proxy
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from support.history import assert_history_complete_async

import jobsd
from jobsd.client import JobSpec
from jobsd.errors import BackendUnavailable
from jobsd.models import Job
from jobsd.registry import Registry
from jobsd.store.db import make_async_pool
from jobsd.worker.claimer import Claimer, ClaimerSettings
from jobsd.worker.clock import ManualClock
from jobsd.worker.holdings import Holdings
from jobsd.worker.stats import DaemonStats
from jobsd.worker.waker import Waker

from .conftest import (
    ADb,
    events_of,
    fetch_job,
    make_settings,
    running_daemon,
    wait_status,
    wait_until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

# a text only the claim statement has, and one only the start of reserved jobs has
CLAIM = b"reserved_until <= now()"
START = b"new_lease_id"


@pytest.fixture
def proxy(db_url: str) -> Iterator[Proxy]:
    """A proxy in front of the test's server."""
    params = conninfo_to_dict(db_url)
    p = Proxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    p.start()
    yield p
    p.close()


def via(db_url: str, proxy: Proxy) -> str:
    """Return ``db_url`` reaching the same database through ``proxy``, without TLS."""
    params = conninfo_to_dict(db_url)
    params.update(host="127.0.0.1", port=str(proxy.port), sslmode="disable")
    return make_conninfo("", **params)


async def test_jobs_of_a_claim_whose_answer_was_lost_run_at_once_and_uncharged(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry, proxy: Proxy
) -> None:
    runs: list[tuple[uuid.UUID, int]] = []

    @jobsd.handler("t", registry=registry)
    async def handler(ctx: jobsd.JobContext) -> None:
        runs.append((ctx.id, ctx.attempt))

    # a stale sweep is ten minutes away: only the daemon's own check can save the jobs
    settings = make_settings(via(db_url, proxy), slots=3, claim_ahead=0, stale_after=600.0)
    async with running_daemon(settings, registry):
        proxy.arm_ambiguous(CLAIM, 1)
        jobs = await client.enqueue_many(
            [JobSpec.build("t", {"n": n}, org_id="acme") for n in range(3)]
        )
        with anyio.fail_after(10):
            for job in jobs:
                await wait_status(db, job.id, "succeeded", "failed")
        assert proxy.triggered == 1, "the claim's answer was dropped"
    assert sorted(runs) == sorted((job.id, 1) for job in jobs), "each ran once, attempt 1"
    for job in jobs:
        row = await fetch_job(db, job.id)
        assert (row["status"], row["attempts"]) == ("succeeded", 1)
        assert [e[1] for e in await events_of(db, job.id)] == ["queued", "running", "succeeded"]
    await assert_history_complete_async(db)


async def test_a_start_whose_answer_was_lost_is_confirmed_and_runs_once(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry, proxy: Proxy
) -> None:
    release = anyio.Event()
    runs: list[tuple[str, int]] = []

    @jobsd.handler("t", registry=registry)
    async def handler(ctx: jobsd.JobContext) -> None:
        runs.append((ctx.payload["name"], ctx.attempt))
        if ctx.payload["name"] == "blocker":
            await release.wait()

    settings = make_settings(via(db_url, proxy), slots=1, claim_ahead=2, claim_ahead_max_wait=10.0)
    async with running_daemon(settings, registry) as d:
        warm = await client.enqueue("t", {"name": "warm"}, org_id="acme")
        await wait_status(db, warm.id, "succeeded")
        blocker = await client.enqueue("t", {"name": "blocker"}, org_id="acme")
        await wait_status(db, blocker.id, "running")
        behind = await client.enqueue("t", {"name": "behind"}, org_id="acme")

        async def held_ahead() -> bool:
            return d.holdings.waiting == 1

        await wait_until(held_ahead, what="the job held ahead")
        proxy.arm_ambiguous(START, 1)
        release.set()
        row = await wait_status(db, behind.id, "succeeded", "failed")
        assert proxy.triggered == 1, "the start's answer was dropped"
    assert row["status"] == "succeeded" and row["attempts"] == 1
    assert runs == [("warm", 1), ("blocker", 1), ("behind", 1)]
    assert [e[1:3] for e in await events_of(db, behind.id)] == [
        ("queued", 0),
        ("running", 1),
        ("succeeded", 1),
    ]
    await assert_history_complete_async(db)


# a text only the outcome statement has
FINISH = b"outcome_rows"


async def test_a_finish_whose_answer_was_lost_is_not_discarded_and_its_hooks_run(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry, proxy: Proxy
) -> None:
    failed: list[uuid.UUID] = []

    @jobsd.handler("t", registry=registry, on_fail=lambda job: failed.append(job.id))
    async def handler(ctx: jobsd.JobContext) -> None:
        if ctx.payload["fail"]:
            raise RuntimeError("boom")

    settings = make_settings(via(db_url, proxy), slots=2, claim_ahead=0)
    async with running_daemon(settings, registry) as d:
        proxy.arm_ambiguous(FINISH, 1)
        jobs = [await client.enqueue("t", {"fail": f}, org_id="acme") for f in (True, False)]
        rows = [await wait_status(db, job.id, "succeeded", "failed") for job in jobs]

        async def hooked() -> bool:
            return failed == [jobs[0].id]

        await wait_until(hooked, what="the on_fail hook of the failed job")
        assert proxy.triggered == 1, "an outcome's answer was dropped"
        assert d.stats.discarded == 0
    assert [r["status"] for r in rows] == ["failed", "succeeded"]
    for job in jobs:
        reasons = [e[3] for e in await events_of(db, job.id)]
        assert not any((r or "").startswith("result discarded") for r in reasons), reasons
    await assert_history_complete_async(db)


async def test_a_claim_lost_in_an_outage_longer_than_the_look_gives_its_slots_back(
    db_url: str, client: jobsd.Client, registry: Registry, proxy: Proxy
) -> None:
    """A claim fails with the database away, and the database stays away longer than
    the daemon looks for that claim's jobs: the slots it booked must still come back
    (they stayed booked, and the daemon never claimed again: fault campaign T10)."""
    jobs = await client.enqueue_many(
        [JobSpec.build("mail", {"n": n}, org_id="acme") for n in range(4)]
    )
    clock = ManualClock()
    started: list[Job] = []
    cfg = ClaimerSettings(worker_id="test-host:1:lost", queues=(), poll_interval_s=1.5)
    holdings = Holdings(4, clock)
    pool = make_async_pool(via(db_url, proxy), name="lost", min_size=1, max_size=2, timeout_s=2)
    await pool.open(wait=True)
    try:
        claimer = Claimer(
            pool, cfg, clock, registry, holdings, Waker(), DaemonStats(), started.append
        )
        proxy.arm_ambiguous(CLAIM, 1)
        with pytest.raises(BackendUnavailable):
            await claimer.run_once()
        assert proxy.triggered == 1 and started == []
        clock.advance(cfg.reconcile_s + 60)  # the outage outlasted the look

        await claimer.run_once()
    finally:
        await pool.close()
    # the 4 jobs of the lost claim are found and started once each, in the slots the
    # claim had booked (start_job here only records them: they stay taken)
    assert sorted(job.id for job in started) == sorted(job.id for job in jobs)
    assert holdings.free == 0
