"""Flow control with real daemons: per-key limits across three daemons, pause and resume
woken by NOTIFY (the poll is far away), dependency chains run to their end."""

from __future__ import annotations

from collections import Counter
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

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

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

# far longer than any test waits: only a NOTIFY can wake a daemon in time
POLL_S = 30.0


class KeyWatch:
    """Count running handlers per concurrency key; remember the peak of each."""

    def __init__(self) -> None:
        self.running: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.done: list[str] = []

    def enter(self, key: str) -> None:
        self.running[key] += 1
        self.peak[key] = max(self.peak[key], self.running[key])

    def leave(self, key: str) -> None:
        self.running[key] -= 1
        self.done.append(key)


async def test_three_daemons_keep_each_key_to_its_limit_and_run_other_keys_meanwhile(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    # One slot per daemon, so who runs what is forced: the first site:1 job holds one
    # daemon until the end; two unkeyed jobs, then the two "p" jobs, each wait for a
    # partner, so they run on the two other daemons at once.
    watch = KeyWatch()
    release_site1 = anyio.Event()
    pair_seen = anyio.Event()
    unkeyed_pair_seen = anyio.Event()

    @jobsd.handler("crawl", registry=registry)
    async def crawl(ctx: jobsd.JobContext) -> None:
        key = ctx.concurrency_key or "none"
        watch.enter(key)
        try:
            if key == "site:1" and ctx.payload["n"] == 0:
                await release_site1.wait()  # site:1 stays busy until the others are done
            if key == "none":
                if watch.running[key] == 2:
                    unkeyed_pair_seen.set()
                with anyio.fail_after(10):
                    await unkeyed_pair_seen.wait()  # unkeyed jobs are not serialized
            await anyio.sleep(0.01)
        finally:
            watch.leave(key)

    @jobsd.handler("pair", registry=registry, concurrency_limit=2)
    async def pair(ctx: jobsd.JobContext) -> None:
        key = ctx.concurrency_key or "none"
        watch.enter(key)
        try:
            if watch.running[key] == 2:
                pair_seen.set()
            with anyio.fail_after(10):
                await pair_seen.wait()  # the first waits until a second of its key runs
        finally:
            watch.leave(key)

    site1 = [
        await client.enqueue("crawl", {"n": n}, org_id="acme", concurrency_key="site:1")
        for n in range(4)
    ]
    others = [
        await client.enqueue("crawl", {"n": n}, org_id="acme", concurrency_key="site:2")
        for n in range(4)
    ] + [await client.enqueue("crawl", {"n": n}, org_id="acme") for n in range(6)]
    pairs = [
        await client.enqueue("pair", {"n": n}, org_id="acme", concurrency_key="p") for n in range(4)
    ]

    async with AsyncExitStack() as stack:
        for i in range(3):
            # claiming ahead on: the daemon whose one slot holds the first site:1 job (it
            # blocks until the end, by design) gives back a job it claimed ahead behind it
            # within the wait (docs/decisions.md, "Claiming ahead")
            settings = make_settings(
                db_url, worker_id=f"d{i}", slots=1, claim_ahead=20, claim_ahead_max_wait=0.3
            )
            await stack.enter_async_context(running_daemon(settings, registry))
        for job in others + pairs:
            await wait_status(db, job.id, "succeeded", timeout_s=20)
        # everything else ran while the first site:1 job held its key
        assert (await fetch_job(db, site1[0].id))["status"] == "running"
        for job in site1[1:]:
            assert (await fetch_job(db, job.id))["status"] == "queued"
        release_site1.set()
        for job in site1:
            await wait_status(db, job.id, "succeeded", timeout_s=20)

    assert watch.peak["site:1"] == 1
    assert watch.peak["site:2"] == 1
    assert watch.peak["p"] == 2
    assert watch.peak["none"] >= 2
    cur = await db.execute(
        "SELECT count(DISTINCT worker_id) FROM jobsd.jobs WHERE status = 'succeeded'"
    )
    assert (await cur.fetchone()) == {"count": 3}  # all three daemons took part
    cur = await db.execute("SELECT max(running) AS running FROM jobsd.concurrency_keys")
    assert (await cur.fetchone()) == {"running": 0}
    await assert_history_complete_async(db)


async def test_pause_stops_claims_at_once_and_resume_wakes_idle_daemons(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    await client.create_queue("mail")
    started: list[int] = []
    release = anyio.Event()

    @jobsd.handler("send", registry=registry)
    async def send(ctx: jobsd.JobContext) -> None:
        started.append(ctx.payload["n"])
        if ctx.payload["n"] == 0:
            await release.wait()

    @jobsd.handler("probe", registry=registry)
    async def probe(ctx: jobsd.JobContext) -> None:
        return None

    settings = make_settings(db_url, poll_interval=POLL_S)
    async with running_daemon(settings, registry):
        running = await client.enqueue("send", {"n": 0}, org_id="acme", queue="mail")
        await wait_status(db, running.id, "running")

        paused = await client.pause_queue("mail")
        assert paused.paused_at is not None
        held = [
            await client.enqueue("send", {"n": n}, org_id="acme", queue="mail") for n in (1, 2, 3)
        ]
        # a job in another queue, enqueued after them, runs: the daemon has claimed
        # since the paused jobs were committed, and left them alone
        probe_job = await client.enqueue("probe", {}, org_id="acme")
        await wait_status(db, probe_job.id, "succeeded")
        release.set()
        await wait_status(db, running.id, "succeeded")  # a running job finishes
        for job in held:
            assert (await fetch_job(db, job.id))["status"] == "queued"
        assert started == [0]

        await client.resume_queue("mail")  # its NOTIFY wakes the idle daemon
        with anyio.fail_after(5):  # the poll is 30 s away
            for job in held:
                await wait_status(db, job.id, "succeeded")
    assert sorted(started) == [0, 1, 2, 3]
    await assert_history_complete_async(db)


async def test_a_dependency_chain_runs_in_order_and_a_failure_fails_what_follows(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    order: list[str] = []

    @jobsd.handler("step", registry=registry)
    async def step(ctx: jobsd.JobContext) -> None:
        order.append(ctx.payload["name"])
        if ctx.payload.get("fail"):
            raise RuntimeError("step failed")

    settings = make_settings(db_url, poll_interval=POLL_S, slots=8)
    async with running_daemon(settings, registry):
        a = await client.enqueue("step", {"name": "a"}, org_id="acme")
        b = await client.enqueue("step", {"name": "b"}, org_id="acme", depends_on=[a.id])
        c = await client.enqueue("step", {"name": "c"}, org_id="acme", depends_on=[b.id])
        x = await client.enqueue("step", {"name": "x"}, org_id="acme")
        y = await client.enqueue(
            "step", {"name": "y", "fail": True}, org_id="acme", depends_on=[x.id]
        )
        z = await client.enqueue("step", {"name": "z"}, org_id="acme", depends_on=[y.id])
        for job in (c, z):
            await wait_status(db, job.id, "succeeded", "failed")
        row_c = await fetch_job(db, c.id)
        row_y = await fetch_job(db, y.id)
        row_z = await fetch_job(db, z.id)

    assert row_c["status"] == "succeeded"
    assert order.index("a") < order.index("b") < order.index("c")
    assert row_y["status"] == "failed"
    assert row_z["status"] == "failed"
    assert row_z["reason"] == f"dependency {y.id} failed"
    assert "z" not in order

    async def settled() -> bool:
        cur = await db.execute(
            "SELECT count(*) AS n FROM jobsd.jobs WHERE status NOT IN "
            "('succeeded', 'failed', 'cancelled')"
        )
        row = await cur.fetchone()
        return row is not None and row["n"] == 0

    await wait_until(settled, what="every job to end")
    await assert_history_complete_async(db)


async def test_a_dependent_scheduled_for_later_starts_on_time_without_the_poll(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    starts: dict[str, datetime] = {}
    later_enqueued = anyio.Event()

    @jobsd.handler("step", registry=registry)
    async def step(ctx: jobsd.JobContext) -> None:
        starts[ctx.payload["name"]] = datetime.now(UTC)
        if ctx.payload["name"] == "first":
            # the dependent is enqueued while its dependency runs: it starts blocked
            # (found once under load: "first" had ended, "later" started scheduled)
            await later_enqueued.wait()

    settings = make_settings(db_url, poll_interval=POLL_S)
    async with running_daemon(settings, registry):
        warm_up = await client.enqueue("step", {"name": "warm"}, org_id="acme")
        await wait_status(db, warm_up.id, "succeeded")  # start-up rounds over: idle
        due = datetime.now(UTC) + timedelta(seconds=1.0)
        first = await client.enqueue("step", {"name": "first"}, org_id="acme")
        later = await client.enqueue(
            "step", {"name": "later"}, org_id="acme", depends_on=[first.id], run_after=due
        )
        later_enqueued.set()
        await wait_status(db, later.id, "succeeded", timeout_s=5)
    assert starts["later"] >= due
    assert (starts["later"] - due).total_seconds() < 0.5, "started a poll interval late"
    assert [e[1] for e in await events_of(db, later.id)] == [
        "blocked",
        "scheduled",
        "queued",
        "running",
        "succeeded",
    ]


async def test_the_next_job_of_a_key_starts_when_the_previous_ends_not_at_the_poll(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    @jobsd.handler("crawl", registry=registry)
    async def crawl(ctx: jobsd.JobContext) -> None:
        return None

    jobs = [  # all there before the daemon starts: no NOTIFY comes later
        await client.enqueue("crawl", {"n": n}, org_id="acme", concurrency_key="site:1")
        for n in range(3)
    ]
    settings = make_settings(db_url, poll_interval=POLL_S)
    async with running_daemon(settings, registry):
        with anyio.fail_after(5):  # one key, limit 1: three rounds, no poll in 30 s
            for job in jobs:
                await wait_status(db, job.id, "succeeded")
