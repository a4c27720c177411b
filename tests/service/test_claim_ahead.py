"""Claiming ahead of the free slots (JOBSD_CLAIM_AHEAD): a job claimed ahead is running
in the database and held (heartbeated) by its daemon, its handler starts when a slot
frees, and on stop the ones never started go back to queued."""

from __future__ import annotations

import anyio
import psycopg
import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.client import JobSpec
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


def _blocking_and_once(registry: Registry) -> anyio.Event:
    """Register ``t`` (blocks until the event is set when its payload says ``block``) and
    ``once`` (at most once, returns at once); return the event."""
    release = anyio.Event()

    @jobsd.handler("t", registry=registry)
    async def handler(ctx: jobsd.JobContext) -> None:
        if ctx.payload.get("block"):
            await release.wait()

    @jobsd.handler("once", registry=registry, delivery="at_most_once")
    async def once(ctx: jobsd.JobContext) -> None:
        return None

    return release


async def _all_succeed(db: ADb, *jobs: jobsd.Job) -> None:
    for job in jobs:
        assert (await wait_status(db, job.id, "succeeded", "failed"))["status"] == "succeeded"


async def test_a_job_claimed_ahead_starts_when_a_slot_frees(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    release = anyio.Event()
    started: list[int] = []

    @jobsd.handler("t", registry=registry)
    async def handler(ctx: jobsd.JobContext) -> None:
        started.append(ctx.payload["n"])
        if ctx.payload["n"] == 1:
            await release.wait()

    async with running_daemon(make_settings(db_url, slots=1, claim_ahead=1), registry) as d:
        first = await client.enqueue("t", {"n": 1}, org_id="acme")
        await wait_status(db, first.id, "running")
        second = await client.enqueue("t", {"n": 2}, org_id="acme")
        # claimed ahead: running in the database, held, its handler not started
        await wait_status(db, second.id, "running")

        async def held_ahead() -> bool:
            # the claim commits before the claimer hands the job to the runner
            return d.holdings.waiting == 1

        await wait_until(held_ahead, what="the second job held, claimed ahead")
        assert started == [1]
        third = await client.enqueue("t", {"n": 3}, org_id="acme")
        await d.claimer.run_once("notify")  # a claim round now takes nothing more
        assert (await fetch_job(db, third.id))["status"] == "queued", "1 slot + 1 ahead"
        release.set()
        for job in (first, second, third):
            assert (await wait_status(db, job.id, "succeeded", "failed"))["status"] == "succeeded"

    assert started == [1, 2, 3]
    assert [e[1] for e in await events_of(db, second.id)] == ["queued", "running", "succeeded"]
    await assert_history_complete_async(db)


async def test_jobs_claimed_ahead_and_never_started_go_back_to_queued_on_stop(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    release = anyio.Event()
    started: list[int] = []

    @jobsd.handler("t", registry=registry)
    async def handler(ctx: jobsd.JobContext) -> None:
        started.append(ctx.payload["n"])
        if ctx.payload["n"]:
            await release.wait()

    settings = make_settings(db_url, slots=1, claim_ahead=2, drain_timeout=5.0)
    async with running_daemon(settings, registry) as d:
        # a short run first: before any run has ended, one round at most is claimed ahead
        warm = await client.enqueue("t", {"n": 0}, org_id="acme")
        await wait_status(db, warm.id, "succeeded")
        first = await client.enqueue("t", {"n": 1}, org_id="acme")
        await wait_status(db, first.id, "running")
        ahead = [await client.enqueue("t", {"n": n}, org_id="acme") for n in (2, 3)]
        for job in ahead:
            await wait_status(db, job.id, "running")
        assert d.holdings.waiting == 2
        d.stop()
        # the stop gives the unstarted ones back at once, before the running one ends
        for job in ahead:
            await wait_status(db, job.id, "queued")
        release.set()

    assert started == [0, 1], "a job claimed ahead never ran after the stop"
    assert (await fetch_job(db, first.id))["status"] == "succeeded"
    for job in ahead:
        row = await fetch_job(db, job.id)
        # no handler ran: the job may run later; its claim stays counted
        assert (row["status"], row["reason"], row["attempts"]) == ("queued", "not started", 1)
        assert [(e[1], e[3]) for e in await events_of(db, job.id)] == [
            ("queued", None),
            ("running", None),
            ("queued", "not started"),
        ]
    await assert_history_complete_async(db)


async def test_claim_ahead_zero_claims_only_for_free_slots(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    release = anyio.Event()

    @jobsd.handler("t", registry=registry)
    async def handler(ctx: jobsd.JobContext) -> None:
        await release.wait()

    async with running_daemon(make_settings(db_url, slots=1, claim_ahead=0), registry) as d:
        first = await client.enqueue("t", {}, org_id="acme")
        await wait_status(db, first.id, "running")
        second = await client.enqueue("t", {}, org_id="acme")
        # a claim round for it would run now if one were allowed: poll the claimer once
        await d.claimer.run_once("notify")
        assert (await fetch_job(db, second.id))["status"] == "queued"
        assert d.holdings.waiting == 0
        release.set()
        await wait_status(db, second.id, "succeeded")
    await assert_history_complete_async(db)


@pytest.mark.parametrize(
    "held_back",
    [
        # older, but keyed: they wait in the queue (the dedup key stays held, the
        # concurrency key free) until a slot is free for them
        [("t", {"dedup_key": "d"}), ("t", {"concurrency_key": "k"})],
        # older, but at most once: a daemon killed with one waiting would fail it unrun
        # ('worker lost'), so it is claimed only into a free slot
        [("once", {})],
    ],
    ids=["dedup_or_concurrency_key", "at_most_once"],
)
async def test_keyed_and_at_most_once_jobs_are_never_claimed_ahead(
    db_url: str,
    db: ADb,
    client: jobsd.Client,
    registry: Registry,
    held_back: list[tuple[str, dict[str, str]]],
) -> None:
    release = _blocking_and_once(registry)
    async with running_daemon(make_settings(db_url, slots=1, claim_ahead=3), registry) as d:
        # a short run first: before any run has ended, one round at most is claimed ahead
        warm = await client.enqueue("t", {}, org_id="acme")
        await wait_status(db, warm.id, "succeeded")
        first = await client.enqueue("t", {"block": True}, org_id="acme")
        await wait_status(db, first.id, "running")
        held = [await client.enqueue(t, {}, org_id="acme", **o) for t, o in held_back]
        plain = await client.enqueue("t", {}, org_id="acme")
        await wait_status(db, plain.id, "running")
        await d.claimer.run_once("notify")
        for job in held:
            row = await fetch_job(db, job.id)
            assert row["status"] == "queued"
            assert row["dedup_key"] == job.dedup_key
        assert d.holdings.waiting == 1
        release.set()
        await _all_succeed(db, first, *held, plain)
    await assert_history_complete_async(db)


def test_claim_ahead_defaults_to_twenty_per_slot_at_most_500() -> None:
    assert make_settings("postgresql://x/y", slots=7).effective_claim_ahead == 140
    assert make_settings("postgresql://x/y", slots=25).effective_claim_ahead == 500
    assert make_settings("postgresql://x/y", slots=100).effective_claim_ahead == 500
    assert make_settings("postgresql://x/y", slots=7, claim_ahead=3).effective_claim_ahead == 3
    assert make_settings("postgresql://x/y", slots=7, claim_ahead=0).effective_claim_ahead == 0


async def test_a_job_left_for_a_free_slot_is_claimed_when_one_frees_not_at_the_next_poll(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    # a round without a free slot claims ahead only what may wait (no key, not at most
    # once): what it left is claimed as soon as a slot frees, with no wake-up (30 s poll)
    release = _blocking_and_once(registry)
    settings = make_settings(db_url, slots=1, claim_ahead=2, poll_interval=30.0)
    async with running_daemon(settings, registry) as d:
        first = await client.enqueue("t", {"block": True}, org_id="acme")
        await wait_status(db, first.id, "running")
        amo = await client.enqueue("once", {}, org_id="acme")
        keyed = await client.enqueue("t", {}, org_id="acme", concurrency_key="k")
        await d.claimer.run_once("notify")  # no free slot: nothing may be claimed ahead
        assert (await fetch_job(db, amo.id))["status"] == "queued"
        assert (await fetch_job(db, keyed.id))["status"] == "queued"
        release.set()
        with anyio.fail_after(5):
            await _all_succeed(db, first, amo, keyed)
    assert d.stats.wakeups["poll"] == 0
    await assert_history_complete_async(db)


@pytest.mark.parametrize("durable", [False, True])
async def test_jobsd_durable_claims_reaches_the_claimer_and_jobs_run_either_way(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry, durable: bool
) -> None:
    _blocking_and_once(registry)
    async with running_daemon(make_settings(db_url, durable_claims=durable), registry) as d:
        assert d.claimer.cfg.durable_claims is durable
        jobs = [await client.enqueue(t, {}, org_id="o") for t in ("t", "once", "t")]
        await _all_succeed(db, *jobs)
    await assert_history_complete_async(db)


async def test_a_job_claimed_ahead_behind_a_blocked_slot_runs_elsewhere(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    release = _blocking_and_once(registry)
    blocker = await client.enqueue("t", {"block": True}, org_id="o")
    behind = await client.enqueue("t", {}, org_id="o")
    settings_a = make_settings(db_url, worker_id="a", slots=1, claim_ahead_max_wait=0.3)
    try:
        async with running_daemon(settings_a, registry) as a:
            # a's first round: the blocker in its slot, the other claimed ahead of it
            row = await wait_status(db, behind.id, "running")
            assert row["worker_id"] == "a"
            assert (await fetch_job(db, blocker.id))["status"] == "running"
            # no slot of a frees: the job goes back for another daemon, unstarted
            row = await wait_status(db, behind.id, "queued", timeout_s=5)
            assert row["reason"] == "not started" and a.stats.given_back == 1
            # and a claims nothing more ahead while its slot stays held: a job enqueued
            # now is b's (below: a never claims it)
            assert a.holdings.ahead_now == 0 and a.holdings.claimable == 0
            later = await client.enqueue("t", {}, org_id="o")
            async with running_daemon(make_settings(db_url, worker_id="b", slots=1), registry):
                for job in (behind, later):
                    row = await wait_status(db, job.id, "succeeded", timeout_s=5)
                    assert row["worker_id"] == "b"
            assert await events_of(db, behind.id) == [
                (None, "queued", 0, None),
                ("queued", "running", 1, None),
                ("running", "queued", 1, "not started"),
                ("queued", "running", 2, None),
                ("running", "succeeded", 2, None),
            ]
            assert [e[1] for e in await events_of(db, later.id)] == [
                "queued",
                "running",
                "succeeded",
            ]
            assert a.stats.given_back == 1
    finally:
        release.set()
    await assert_history_complete_async(db)


async def test_a_job_claimed_ahead_starts_only_once_armed_in_the_database(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    # beyond a round of the slots, a claim marks the jobs it takes ahead (a crash then
    # requeues them unrun); each handler finds its job's mark cleared when it starts
    release = anyio.Event()
    marks: dict[int, object] = {}

    @jobsd.handler("t", registry=registry)
    async def handler(ctx: jobsd.JobContext) -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT claimed_ahead FROM jobsd.jobs WHERE id = %s", (ctx.id,)
            )
            marks[ctx.payload["n"]] = (await cur.fetchone() or [None])[0]
        if ctx.payload["n"] == 0:
            await anyio.sleep(0.05)  # runs of 50 ms: one job at a time is armed
        if ctx.payload["n"] == 1:
            await release.wait()

    settings = make_settings(db_url, slots=1, claim_ahead=5, claim_ahead_max_wait=10.0)
    async with running_daemon(settings, registry) as d:
        warm = await client.enqueue("t", {"n": 0}, org_id="acme")
        await wait_status(db, warm.id, "succeeded")
        first = await client.enqueue("t", {"n": 1}, org_id="acme")
        await wait_status(db, first.id, "running")
        ahead = await client.enqueue_many(
            [JobSpec.build("t", {"n": n}, org_id="acme") for n in (2, 3, 4)]
        )
        for job in ahead:
            await wait_status(db, job.id, "running")
        assert d.holdings.waiting == 3
        # the first claimed ahead is armed by its claim (a round of the one slot), the
        # others are marked until armed one by one as the slot turns over
        assert [(await fetch_job(db, j.id))["claimed_ahead"] for j in ahead] == [
            None,
            True,
            True,
        ]
        release.set()
        await _all_succeed(db, first, *ahead)
    assert marks == {0: None, 1: None, 2: None, 3: None, 4: None}
    for job in ahead:
        assert (await fetch_job(db, job.id))["claimed_ahead"] is None
    await assert_history_complete_async(db)
