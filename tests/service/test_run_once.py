"""Each service built on its own and stepped with ``run_once`` on a pinned clock.

No daemon and no waiting on the wall clock: a job due in an hour, a owner unresponsive,
a heartbeat interval are reached by moving a ``ManualClock``.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

import jobsd
from jobsd.errors import BackendUnavailable, ConfigError
from jobsd.models import Job
from jobsd.registry import Registry
from jobsd.store import queries
from jobsd.store.db import AsyncPool
from jobsd.store.listen import open_listen_connection
from jobsd.store.workers import open_worker_connection
from jobsd.worker.claimer import Claimer, ClaimerSettings
from jobsd.worker.clock import ManualClock
from jobsd.worker.completer import Completer, CompleterSettings
from jobsd.worker.executor import JobRunner, RunnerSettings, make_context
from jobsd.worker.heartbeat import Heartbeat, HeartbeatSettings
from jobsd.worker.holdings import Holdings
from jobsd.worker.hooks import FailHooks, HooksSettings
from jobsd.worker.lifeline import Lifeline, LifelineSettings
from jobsd.worker.listener import CHANNEL, Listener, ListenerSettings
from jobsd.worker.stats import DaemonStats
from jobsd.worker.sweeper import Sweeper, SweeperSettings
from jobsd.worker.waker import Waker

from .conftest import ADb, fetch_job, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

WORKER = "test-host:1:run-once"


def claimer_for(
    pool: AsyncPool, clock: ManualClock, registry: Registry, started: list[Job]
) -> Claimer:
    """Build a claimer with 4 slots that records the jobs it starts."""
    cfg = ClaimerSettings(worker_id=WORKER, queues=(), poll_interval_s=1.5)
    return Claimer(
        pool, cfg, clock, registry, Holdings(4, clock), Waker(), DaemonStats(), started.append
    )


async def test_claimer_promotes_a_job_due_later_when_the_clock_gets_there(
    pool: AsyncPool, client: jobsd.Client, registry: Registry
) -> None:
    later = await client.enqueue(
        "mail", org_id="acme", run_after=datetime.now(UTC) + timedelta(hours=1)
    )
    clock = ManualClock()
    started: list[Job] = []
    claimer = claimer_for(pool, clock, registry, started)

    idle = await claimer.run_once()
    assert (idle.claimed, idle.promoted, idle.more) == (0, 0, False)  # not due yet
    clock.advance(2 * 3600)
    done = await claimer.run_once()

    assert (done.claimed, done.promoted, done.more) == (1, 1, False)
    assert [job.id for job in started] == [later.id]
    assert started[0].status == "running" and started[0].worker_id == WORKER
    # the claim booked the free slots; the started job takes one (here start_job only
    # records it), the others are free again
    assert claimer.holdings.free == 3


class _ClockAhead(ManualClock):
    """A daemon whose wall clock runs an hour ahead while statements use the database's."""

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(hours=1)

    def sql_now(self) -> None:
        return None


async def test_claimer_sleeps_until_the_due_time_on_the_databases_clock(
    pool: AsyncPool, client: jobsd.Client, registry: Registry
) -> None:
    """A daemon clock ahead of the database must not make a job due later look due now
    (fault campaign T11a: the claimer promoted and claimed in a tight loop)."""
    await client.enqueue("mail", org_id="acme", run_after=datetime.now(UTC) + timedelta(minutes=5))
    clock = _ClockAhead()
    claimer = claimer_for(pool, clock, registry, [])

    await claimer.run_once()

    assert claimer._next_due is not None
    assert 200 < claimer._next_due - clock.monotonic() <= 300
    assert claimer._sleep_s() > 0.5, "an idle claimer waits for its poll, it does not spin"


async def test_heartbeat_beats_when_its_interval_has_passed_on_the_clock(
    pool: AsyncPool, client: jobsd.Client, db: ADb
) -> None:
    job = await client.enqueue("mail", org_id="acme")
    async with pool.connection() as conn:
        (claimed,) = await queries.claim_batch(
            conn, limit=1, worker_id=WORKER, queues=None, keep_dedup_types=[]
        )
    clock = ManualClock()
    holdings = Holdings(1, clock)
    held = holdings.add(claimed, make_context(claimed))
    heartbeat = Heartbeat(pool, HeartbeatSettings(tick_s=1.0, beat_s=10.0), clock, holdings)

    assert await heartbeat.run_once() == 0  # nothing to say before the beat
    assert "updated_at" not in ((await fetch_job(db, job.id))["progress"] or {})
    await held.ctx.progress(done=3)
    assert await heartbeat.run_once() == 1  # progress goes out on the next tick
    clock.advance(10)
    assert await heartbeat.run_once() == 1  # the beat

    progress = (await fetch_job(db, job.id))["progress"]
    assert progress["done"] == 3 and "updated_at" in progress


async def test_sweeper_finds_a_heartbeat_stale_on_its_clock(
    pool: AsyncPool, client: jobsd.Client, db: ADb, registry: Registry
) -> None:
    @jobsd.handler("mail", max_attempts=3, registry=registry)
    async def mail(ctx: jobsd.JobContext) -> None:
        return None

    job = await client.enqueue("mail", org_id="acme")
    await db.execute(
        "UPDATE jobsd.jobs SET status = 'running', attempts = 1, lease_id = gen_random_uuid(),"
        " worker_id = 'gone:1:x', started_at = now() - interval '500 s',"
        " progress = jsonb_build_object('updated_at', now() - interval '500 s')"
        " WHERE id = %s",
        (job.id,),
    )
    clock = ManualClock()
    cfg = SweeperSettings(
        worker_id=WORKER,
        death_check_interval_s=5.0,
        sweep_interval_s=60.0,
        stale_after_s=600.0,
        default_max_attempts=1,
    )
    failed: list[Job] = []
    sweeper = Sweeper(pool, cfg, clock, registry, DaemonStats(), failed.append)

    assert await sweeper.run_once() == {}  # 500 s old: not stale yet
    clock.advance(200)
    assert await sweeper.run_once() == {"queued": 1}
    assert (await fetch_job(db, job.id))["status"] == "queued"
    assert failed == []


async def test_sweeper_holds_off_after_the_database_clock_steps_forward(
    pool: AsyncPool, client: jobsd.Client, db: ADb, registry: Registry
) -> None:
    """T11b: a step of the clock that stamps leases ages them all at once; live
    owners are not swept, a silent one still is once the hold is over."""

    @jobsd.handler("mail", max_attempts=3, registry=registry)
    async def mail(ctx: jobsd.JobContext) -> None:
        return None

    clock = ManualClock()
    live = await client.enqueue("mail", org_id="acme")
    silent = await client.enqueue("mail", org_id="acme")

    async def beat(job_id: uuid.UUID) -> None:
        # each job's owner (a worker of its own) renews its lease, ending now
        owner = f"w:{job_id}"
        await db.execute(
            "UPDATE jobsd.jobs SET status = 'running', attempts = 1,"
            " lease_id = coalesce(lease_id, gen_random_uuid()), worker_id = %(owner)s,"
            " started_at = coalesce(started_at, %(now)s) WHERE id = %(id)s",
            {"now": clock.now(), "id": job_id, "owner": owner},
        )
        await db.execute(
            "INSERT INTO jobsd.workers (worker_id, hostname, pid, alive_until)"
            " VALUES (%(owner)s, 'h', 1, %(now)s) ON CONFLICT (worker_id)"
            " DO UPDATE SET alive_until = excluded.alive_until",
            {"now": clock.now(), "owner": owner},
        )

    await beat(live.id)
    await beat(silent.id)
    cfg = SweeperSettings(
        worker_id=WORKER,
        death_check_interval_s=5.0,
        sweep_interval_s=1.0,
        stale_after_s=3.0,
        default_max_attempts=1,
    )
    sweeper = Sweeper(pool, cfg, clock, registry, DaemonStats(), lambda job: None)
    assert await sweeper.sweep_stale() == {}
    clock.advance(1)
    assert await sweeper.sweep_stale() == {}

    clock.jump(6)  # both leases are now 7 s old on that clock: twice the threshold
    assert await sweeper.sweep_stale() == {}
    assert sweeper.clock_watch.jumps == 1
    clock.advance(1)
    await beat(live.id)  # the live owner beats again, on the stepped clock
    assert await sweeper.sweep_stale() == {}
    clock.advance(2)
    await beat(live.id)
    # the hold is over: the owner that never beat again is swept, the live one is not
    assert await sweeper.sweep_stale() == {"queued": 1}
    assert (await fetch_job(db, silent.id))["reason"] == "owner unresponsive"
    assert (await fetch_job(db, live.id))["status"] == "running"


async def test_runner_completer_and_hooks_see_a_job_through(
    pool: AsyncPool, client: jobsd.Client, db: ADb, registry: Registry
) -> None:
    hooked: list[uuid.UUID] = []

    @jobsd.handler("ok", registry=registry)
    async def ok(ctx: jobsd.JobContext) -> dict[str, int]:
        return {"n": 1}

    @jobsd.handler("boom", registry=registry, on_fail=lambda job: hooked.append(job.id))
    async def boom(ctx: jobsd.JobContext) -> None:
        raise ValueError("no")

    good = await client.enqueue("ok", org_id="acme")
    bad = await client.enqueue("boom", org_id="acme")
    async with pool.connection() as conn:
        claimed = await queries.claim_batch(
            conn, limit=2, worker_id=WORKER, queues=None, keep_dedup_types=[]
        )
    clock = ManualClock()
    stats = DaemonStats()
    holdings = Holdings(2, clock)
    hooks = FailHooks(pool, HooksSettings(worker_id=WORKER), clock, registry)
    completer = Completer(
        pool, CompleterSettings(worker_id=WORKER), clock, holdings, stats, Waker(), hooks.submit
    )
    runner = JobRunner(
        RunnerSettings(grace_s=1.0), clock, registry, holdings, stats, completer.submit
    )

    outcomes = {job.type: await runner.run_once(job) for job in claimed}
    assert (outcomes["ok"].status, outcomes["boom"].status) == ("succeeded", "failed")
    assert completer.pending == 2 and holdings.running == 0 and len(holdings) == 2
    assert await completer.run_once() == 2
    assert completer.pending == 0 and len(holdings) == 0
    assert (await fetch_job(db, good.id))["status"] == "succeeded"
    assert (await fetch_job(db, bad.id))["status"] == "failed"
    assert await hooks.run_once() == 1
    assert hooked == [bad.id]
    assert await completer.run_once() == 0 and await hooks.run_once() == 0


async def test_lifeline_registers_touches_and_deregisters(db_url: str, db: ADb) -> None:
    cfg = LifelineSettings(
        worker_id=WORKER, interval_s=5.0, lease_s=30.0, hostname="test-host", pid=1
    )
    lifeline = Lifeline(partial(open_worker_connection, db_url), cfg, ManualClock())

    async def locked_elsewhere() -> bool:
        cur = await db.execute(
            "SELECT pg_try_advisory_lock(jobsd.worker_lock_key(%s)) AS got", (WORKER,)
        )
        row = await cur.fetchone()
        assert row is not None
        if row["got"]:
            await db.execute("SELECT pg_advisory_unlock(jobsd.worker_lock_key(%s))", (WORKER,))
        return not row["got"]

    async def registered_rows() -> int:
        cur = await db.execute(
            "SELECT count(*) AS n FROM jobsd.workers WHERE worker_id = %s", (WORKER,)
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row["n"])

    try:
        assert await lifeline.run_once() is True
        assert await registered_rows() == 1 and await locked_elsewhere()
        assert await lifeline.run_once() is False  # a touch
        await db.execute("DELETE FROM jobsd.workers WHERE worker_id = %s", (WORKER,))
        assert await lifeline.run_once() is False  # the row is put back
        assert await registered_rows() == 1 and lifeline.registrations == 1
    finally:
        await lifeline.aclose()
    assert await registered_rows() == 0

    async def lock_free() -> bool:
        return not await locked_elsewhere()

    # the server ends the closed session (and frees its lock) a moment after the close
    await wait_until(lock_free, what="the worker lock to be released", timeout_s=5)


async def test_listener_wakes_the_claimer_for_its_queues_only(db_url: str, db: ADb) -> None:
    connect = partial(
        open_listen_connection, db_url, CHANNEL, application_name="test", operation="listen"
    )
    waker = Waker()
    listener = Listener(
        connect, ListenerSettings(queues=frozenset({"mail"})), ManualClock(), waker, DaemonStats()
    )
    try:
        assert await listener.run_once() == 0
        assert listener.connected and await waker.wait(0) == "reconnect"
        await db.execute("SELECT pg_notify(%s, 'other'), pg_notify(%s, 'mail')", (CHANNEL,) * 2)
        assert await listener.run_once(timeout_s=10, stop_after=2) == 1
        assert await waker.wait(0) == "notify"
    finally:
        await listener.aclose()
    assert not listener.connected


async def test_a_lost_lifeline_connection_is_dropped_and_remade(db_url: str, db: ADb) -> None:
    cfg = LifelineSettings(
        worker_id=WORKER, interval_s=5.0, lease_s=30.0, hostname="test-host", pid=1
    )
    lifeline = Lifeline(partial(open_worker_connection, db_url), cfg, ManualClock())
    try:
        assert await lifeline.run_once() is True
        await db.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE application_name = 'jobsd-lifeline' AND datname = current_database()"
        )
        with pytest.raises(BackendUnavailable):
            await lifeline.run_once()
        assert not lifeline.registered
        assert await lifeline.run_once() is True  # reconnected, locked, registered again
        assert lifeline.registrations == 2
    finally:
        await lifeline.aclose()


async def test_the_lifeline_connection_gets_the_tls_policy(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "0")
    with pytest.raises(ConfigError, match="refusing an unencrypted database connection"):
        await open_worker_connection(db_url)  # plaintext TCP: refused, never retried
