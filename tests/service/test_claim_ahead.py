"""Claiming ahead of the free slots (JOBSD_CLAIM_AHEAD): a job claimed ahead is reserved
by its daemon (queued in the database, charged nothing), it becomes running, with its
attempt counted, when a slot frees and its handler starts, and on stop the ones never
started are given back as they were."""

from __future__ import annotations

from typing import Any

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


async def wait_reserved(db: ADb, job_id: object, worker_id: str | None = None) -> dict[str, Any]:
    """Wait until a job is reserved (queued, with a reservation); return its row."""
    row: dict[str, Any] = {}

    async def reserved() -> bool:
        nonlocal row
        row = await fetch_job(db, job_id)
        return row["status"] == "queued" and row["reserved_until"] is not None

    await wait_until(reserved, what=f"job {job_id} reserved")
    assert worker_id is None or row["worker_id"] == worker_id
    return row


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
        # claimed ahead: reserved, queued in the database, held, its handler not started
        row = await wait_reserved(db, second.id)
        assert (row["attempts"], row["started_at"]) == (0, None)

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
            await wait_reserved(db, job.id)

        async def both_held() -> bool:
            return d.holdings.waiting == 2

        await wait_until(both_held, what="both jobs held ahead")
        d.stop()

        # the stop gives the reservations back at once, before the running one ends
        async def given_back() -> bool:
            rows = [await fetch_job(db, job.id) for job in ahead]
            return all(row["reserved_until"] is None for row in rows)

        await wait_until(given_back, what="the reservations given back")
        release.set()

    assert started == [0, 1], "a job claimed ahead never ran after the stop"
    assert (await fetch_job(db, first.id))["status"] == "succeeded"
    for job in ahead:
        row = await fetch_job(db, job.id)
        # no handler ran: nothing was charged, nothing happened to the job
        assert (row["status"], row["attempts"], row["worker_id"], row["lease_id"]) == (
            "queued",
            0,
            None,
            None,
        )
        assert await events_of(db, job.id) == [(None, "queued", 0, None)]
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
        await wait_reserved(db, plain.id)
        await d.claimer.run_once("notify")
        for job in held:
            row = await fetch_job(db, job.id)
            assert (row["status"], row["reserved_until"]) == ("queued", None)
            assert row["dedup_key"] == job.dedup_key
        assert d.holdings.waiting == 1
        release.set()
        await _all_succeed(db, first, *held, plain)
    await assert_history_complete_async(db)


def test_claim_ahead_is_off_unless_set() -> None:
    # a job claimed ahead is a write of its row more (its reservation): off by default
    assert make_settings("postgresql://x/y", slots=7).effective_claim_ahead == 0
    assert make_settings("postgresql://x/y", slots=100).effective_claim_ahead == 0
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
    settings_a = make_settings(
        db_url, worker_id="a", slots=1, claim_ahead=20, claim_ahead_max_wait=0.3
    )
    try:
        async with running_daemon(settings_a, registry) as a:
            # a's first round: the blocker in its slot, the other reserved behind it
            await wait_reserved(db, behind.id, "a")
            assert (await fetch_job(db, blocker.id))["status"] == "running"

            # no slot of a frees: the reservation is given back for another daemon
            async def given_back() -> bool:
                return (await fetch_job(db, behind.id))["reserved_until"] is None

            await wait_until(given_back, what="the reservation given back", timeout_s=5)
            assert a.stats.given_back == 1
            # and a claims nothing more ahead while its slot stays held: a job enqueued
            # now is b's (below: a never claims it)
            assert a.holdings.ahead_now == 0 and a.holdings.claimable == 0
            later = await client.enqueue("t", {}, org_id="o")
            async with running_daemon(make_settings(db_url, worker_id="b", slots=1), registry):
                for job in (behind, later):
                    row = await wait_status(db, job.id, "succeeded", timeout_s=5)
                    assert row["worker_id"] == "b"
            # its one run is its first attempt: the reservation charged nothing
            assert await events_of(db, behind.id) == [
                (None, "queued", 0, None),
                ("queued", "running", 1, None),
                ("running", "succeeded", 1, None),
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


async def test_a_reserved_job_is_running_with_its_attempt_counted_when_its_handler_starts(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    # every handler finds its own row running, under its lease, at the attempt it is
    # told; and no more rows are running than the daemon's one slot plus the outcomes
    # on their way to the database (an ended run is running until its outcome is written)
    release = anyio.Event()
    seen: dict[int, tuple[Any, ...]] = {}
    running_rows: list[tuple[int, int]] = []
    daemon: list[Any] = []

    @jobsd.handler("t", registry=registry)
    async def handler(ctx: jobsd.JobContext) -> None:
        in_flight = daemon[0].completer.pending
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT status, attempts, reserved_until IS NULL, "
                "(SELECT count(*) FROM jobsd.jobs WHERE status = 'running') "
                "FROM jobsd.jobs WHERE id = %s",
                (ctx.id,),
            )
            row = await cur.fetchone()
            assert row is not None
            seen[ctx.payload["n"]] = (row[0], row[1], ctx.attempt, row[2])
            in_flight = max(in_flight, daemon[0].completer.pending)
            running_rows.append((row[3], in_flight))
        if ctx.payload["n"] == 1:
            await release.wait()

    settings = make_settings(db_url, slots=1, claim_ahead=5, claim_ahead_max_wait=10.0)
    async with running_daemon(settings, registry) as d:
        daemon.append(d)
        warm = await client.enqueue("t", {"n": 0}, org_id="acme")
        await wait_status(db, warm.id, "succeeded")
        first = await client.enqueue("t", {"n": 1}, org_id="acme")
        await wait_status(db, first.id, "running")
        ahead = await client.enqueue_many(
            [JobSpec.build("t", {"n": n}, org_id="acme") for n in (2, 3, 4)]
        )
        for job in ahead:
            await wait_reserved(db, job.id)

        async def all_held() -> bool:
            return d.holdings.waiting == 3

        await wait_until(all_held, what="three jobs held ahead")
        rows = [await fetch_job(db, j.id) for j in ahead]
        assert [(r["status"], r["attempts"]) for r in rows] == [("queued", 0)] * 3
        release.set()
        await _all_succeed(db, first, *ahead)
    assert seen == {n: ("running", 1, 1, True) for n in range(5)}
    over = [(rows, in_flight) for rows, in_flight in running_rows if rows > 1 + in_flight]
    assert over == [], "one slot: one running row, besides the outcomes on their way"
    await assert_history_complete_async(db)


async def test_a_retry_policy_of_two_behind_a_long_job_gets_two_real_runs(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    # one slot held by a long job; the flaky job waits reserved behind it (and may be
    # given back and reserved again): its two attempts are its two handler runs
    release = anyio.Event()
    runs: list[int] = []

    @jobsd.handler("long", registry=registry)
    async def long(ctx: jobsd.JobContext) -> None:
        await release.wait()

    @jobsd.handler("flaky", registry=registry, retry=jobsd.RetryPolicy(2, backoff=0.05))
    async def flaky(ctx: jobsd.JobContext) -> None:
        runs.append(ctx.attempt)
        raise RuntimeError(f"attempt {ctx.attempt} failed")

    settings = make_settings(db_url, slots=1, claim_ahead=2, claim_ahead_max_wait=0.3)
    async with running_daemon(settings, registry) as d:
        blocker = await client.enqueue("long", {}, org_id="acme")
        await wait_status(db, blocker.id, "running")
        job = await client.enqueue("flaky", {}, org_id="acme")

        # a reservation given back (the only job that can be reserved is the flaky
        # one) proves it was reserved: watching for the reservation itself, a window
        # of claim_ahead_max_wait, can miss it on a loaded machine
        async def given_back() -> bool:
            return d.stats.given_back >= 1

        await wait_until(given_back, what="the reservation given back")
        assert (await fetch_job(db, job.id))["attempts"] == 0
        release.set()
        row = await wait_status(db, job.id, "failed", "succeeded", timeout_s=10)
    assert runs == [1, 2]
    assert (row["status"], row["attempts"]) == ("failed", 2)
    await assert_history_complete_async(db)
