"""The scheduler of periodic jobs, stepped with ``run_once`` on a pinned clock.

Each pass reads the pinned time (``ManualClock.sql_now``), so hours and days of
ticks, a gap, a DST change, take no wall time. Every assertion is on rows: jobs,
ticks, the schedules' counters.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import pytest

from jobsd.admin.queues import create_queue
from jobsd.errors import ConfigError, TransientConflict, UnknownSchedule
from jobsd.periodic import TICK_KEY, Schedule
from jobsd.store import schedules as store
from jobsd.store.connect import make_async_pool
from jobsd.store.db import AsyncPool
from jobsd.worker.clock import ManualClock
from jobsd.worker.scheduler import Scheduler, SchedulerPass, SchedulerSettings

from .conftest import ADb, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PARIS = ZoneInfo("Europe/Paris")


@pytest.fixture
async def pools(db_url: str) -> AsyncIterator[list[AsyncPool]]:
    """Open three pools on the test's database: one per scheduler, as three daemons."""
    opened = []
    try:
        for n in range(3):
            pool = make_async_pool(db_url, name=f"sched{n}", min_size=1, max_size=2, timeout_s=5)
            await pool.open(wait=True)
            opened.append(pool)
        yield opened
    finally:
        for pool in opened:
            await pool.close()


def scheduler(
    pool: AsyncPool,
    clock: ManualClock,
    schedules: Sequence[Schedule],
    *,
    worker: str = "w1",
    **cfg: Any,
) -> Scheduler:
    return Scheduler(pool, SchedulerSettings(worker_id=worker, **cfg), clock, schedules)


async def ticks_of(db: ADb, schedule_id: str) -> list[dict[str, Any]]:
    """Return the jobs of a schedule with their tick, oldest tick first."""
    cur = await db.execute(
        "SELECT id, status, payload, created_at FROM jobsd.jobs "
        "WHERE payload -> %s ->> 'id' = %s ORDER BY payload -> %s ->> 'tick'",
        (TICK_KEY, schedule_id, TICK_KEY),
    )
    rows = await cur.fetchall()
    for row in rows:
        row["tick"] = datetime.fromisoformat(row["payload"][TICK_KEY]["tick"])
    return rows


async def counters(db: ADb, schedule_id: str) -> dict[str, Any]:
    cur = await db.execute(
        "SELECT fired, refused, late, skipped, last_tick, last_job_id FROM jobsd.schedules "
        "WHERE id = %s",
        (schedule_id,),
    )
    row = await cur.fetchone()
    assert row is not None
    return dict(row)


async def test_three_schedulers_fire_one_job_per_tick_over_25_ticks(
    pools: list[AsyncPool], db: ADb
) -> None:
    every = Schedule.build(id="beat", type="beat", org_id="acme", every="1m", payload={"n": 1})
    start = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
    clock = ManualClock(start)
    peers = [scheduler(pool, clock, [every], worker=f"w{n}") for n, pool in enumerate(pools)]
    passes: list[SchedulerPass] = []

    async def step(peer: Scheduler) -> None:
        passes.append(await peer.run_once())

    for _ in range(25):
        async with anyio.create_task_group() as tg:  # the three race for each tick
            for peer in peers:
                tg.start_soon(step, peer)
        clock.advance(60)
    async with anyio.create_task_group() as tg:
        for peer in peers:
            tg.start_soon(step, peer)

    jobs = await ticks_of(db, "beat")
    expected = [start + timedelta(seconds=30 + 60 * n) for n in range(25)]
    assert [j["tick"] for j in jobs] == expected  # one job per tick, none missing
    assert all(j["payload"]["n"] == 1 for j in jobs)
    assert sum(p.fired for p in passes) == 25
    assert sum(p.taken for p in passes) <= 50  # the others found the tick taken
    cur = await db.execute(
        "SELECT count(*) AS n, count(DISTINCT worker_id) AS workers FROM jobsd.schedule_ticks "
        "WHERE schedule_id = 'beat' AND outcome = 'enqueued'"
    )
    row = await cur.fetchone()
    assert row is not None and row["n"] == 25
    state = await counters(db, "beat")
    assert (state["fired"], state["refused"], state["late"], state["skipped"]) == (25, 0, 0, 0)
    assert state["last_tick"] == expected[-1]
    assert state["last_job_id"] == jobs[-1]["id"]


@pytest.mark.parametrize(
    ("catch_up", "fired_late", "skipped"),
    [("latest", 1, 9), ("all", 4, 6), ("none", 0, 10)],
)
async def test_a_scheduler_starting_after_a_gap_applies_the_catch_up_policy(
    pools: list[AsyncPool], db: ADb, catch_up: str, fired_late: int, skipped: int
) -> None:
    schedule = Schedule.build(
        id=f"gap-{catch_up}",
        type="gap",
        org_id="acme",
        every="60s",
        catch_up=catch_up,
        catch_up_max=4 if catch_up == "all" else None,
    )
    start = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
    clock = ManualClock(start)
    first = scheduler(pools[0], clock, [schedule], grace_s=10)
    assert (await first.run_once()).fired == 0  # declared; no tick yet

    clock.advance(600)  # ten ticks (12:01 .. 12:10) while no scheduler ran
    later = scheduler(pools[1], clock, [schedule], grace_s=10, worker="late")
    done = await later.run_once()
    assert (done.fired, done.late, done.skipped) == (fired_late, fired_late, skipped)
    jobs = await ticks_of(db, schedule.id)
    newest = [start + timedelta(seconds=30 + 60 * n) for n in range(10)][-fired_late:]
    assert [j["tick"] for j in jobs] == (newest if fired_late else [])
    again = await later.run_once()  # nothing is fired twice, nothing skipped twice
    assert (again.fired, again.skipped) == (0, 0)

    clock.advance(35)  # the next tick, 12:11, is on time: it fires whatever the policy
    done = await later.run_once()
    assert (done.fired, done.late) == (1, 0)
    state = await counters(db, schedule.id)
    assert (state["fired"], state["late"], state["skipped"]) == (
        fired_late + 1,
        fired_late,
        skipped,
    )
    assert state["last_tick"] == start + timedelta(seconds=30 + 60 * 10)


async def step_through(sched: Scheduler, clock: ManualClock, until: datetime) -> None:
    """Run passes as ``Scheduler.run`` does: each one just after the next tick."""
    while clock.now() < until:
        done = await sched.run_once()
        assert done.next_tick is not None and done.now is not None
        clock.advance((done.next_tick - done.now).total_seconds() + 1)


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        pytest.param(
            datetime(2026, 3, 27, 12, 0, tzinfo=PARIS),
            datetime(2026, 3, 31, 12, 0, tzinfo=PARIS),
            # 02:30 does not exist on the 29th: it runs at 03:00 (CEST), once
            ["2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00",
             "2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"],
            id="spring",
        ),
        pytest.param(
            datetime(2026, 10, 23, 12, 0, tzinfo=PARIS),
            datetime(2026, 10, 27, 12, 0, tzinfo=PARIS),
            # 02:30 exists twice on the 25th: it runs the first time only
            ["2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00",
             "2026-10-26T02:30:00+01:00", "2026-10-27T02:30:00+01:00"],
            id="autumn",
        ),
    ],
)  # fmt: skip
async def test_a_daily_tick_in_europe_paris_neither_skips_nor_doubles_across_dst(
    pools: list[AsyncPool], db: ADb, start: datetime, end: datetime, expected: list[str]
) -> None:
    daily = Schedule.build(
        "30 2 * * *", id="nightly", type="purge", org_id="acme", timezone="Europe/Paris"
    )
    clock = ManualClock(start.astimezone(UTC))
    await step_through(scheduler(pools[0], clock, [daily]), clock, end.astimezone(UTC))
    jobs = await ticks_of(db, "nightly")
    assert [j["tick"].astimezone(PARIS).isoformat() for j in jobs] == expected
    state = await counters(db, "nightly")
    assert (state["fired"], state["late"], state["skipped"]) == (4, 0, 0)


async def test_an_hourly_tick_in_europe_paris_fires_every_real_hour_across_autumn_dst(
    pools: list[AsyncPool], db: ADb
) -> None:
    hourly = Schedule.build(
        "0 * * * *", id="hourly", type="purge", org_id="acme", timezone="Europe/Paris"
    )
    start = datetime(2026, 10, 24, 22, 30, tzinfo=UTC)
    clock = ManualClock(start)
    await step_through(scheduler(pools[0], clock, [hourly]), clock, start + timedelta(hours=6))
    jobs = await ticks_of(db, "hourly")
    # 02:00 comes twice that night (CEST then CET): two real hours, two jobs
    assert [j["tick"] for j in jobs] == [start + timedelta(minutes=30 + 60 * n) for n in range(6)]


async def test_a_paused_schedule_fires_nothing_and_resumes_at_the_next_tick(
    pools: list[AsyncPool], db: ADb
) -> None:
    every = Schedule.build(id="p", type="p", org_id="acme", every="60s")
    start = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
    clock = ManualClock(start)
    sched = scheduler(pools[0], clock, [every])
    await sched.run_once()
    clock.advance(60)
    assert (await sched.run_once()).fired == 1  # 12:01

    async with pools[1].connection() as conn:
        info = await store.pause(conn, "p", clock.sql_now())
    assert info.paused and info.next_tick(clock.now()) is None
    for _ in range(3):  # 12:02, 12:03, 12:04 fall while paused
        clock.advance(60)
        assert (await sched.run_once()).fired == 0
    clock.advance(20)  # 12:04:50
    async with pools[1].connection() as conn:
        info = await store.resume(conn, "p", clock.sql_now())
    assert not info.paused
    assert info.next_tick(clock.now()) == datetime(2026, 6, 1, 12, 5, tzinfo=UTC)
    done = await sched.run_once()
    assert (done.fired, done.skipped) == (0, 0)  # the paused ticks are not caught up
    clock.advance(15)  # 12:05:05
    assert (await sched.run_once()).fired == 1

    jobs = await ticks_of(db, "p")
    assert [j["tick"] for j in jobs] == [
        datetime(2026, 6, 1, 12, 1, tzinfo=UTC),
        datetime(2026, 6, 1, 12, 5, tzinfo=UTC),
    ]
    async with pools[1].connection() as conn:
        with pytest.raises(UnknownSchedule, match="'nope'"):
            await store.pause(conn, "nope")
        with pytest.raises(UnknownSchedule, match="'nope'"):
            await store.resume(conn, "nope")


async def test_a_refused_tick_is_counted_once_and_the_next_tick_still_fires(
    pools: list[AsyncPool], db: ADb, caplog: pytest.LogCaptureFixture
) -> None:
    async with pools[0].connection() as conn:
        await create_queue(conn, "tiny", capacity=1)
    every = Schedule.build(id="full", type="t", org_id="acme", every="60s", queue="tiny")
    start = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
    clock = ManualClock(start)
    peers = [scheduler(pool, clock, [every], worker=f"w{n}") for n, pool in enumerate(pools)]
    await peers[0].run_once()
    clock.advance(60)
    assert (await peers[0].run_once()).fired == 1  # 12:01: the queue is now full

    clock.advance(60)  # 12:02: refused by the capacity
    with caplog.at_level("WARNING", logger="jobsd.worker.scheduler"):
        passes = [await peer.run_once() for peer in peers]
    assert [p.refused for p in passes] == [1, 0, 0]  # once, by one scheduler
    # only this logger's warnings (another test may have left handlers and levels set)
    warned = [r for r in caplog.records if r.name == "jobsd.worker.scheduler" and r.levelno >= 30]
    assert [r.message for r in warned] == ["schedule.refused"]
    assert "is full" in warned[0].reason  # type: ignore[attr-defined]
    again = [await peer.run_once() for peer in peers]  # no retry, by anyone
    assert sum(p.refused + p.fired for p in again) == 0

    cur = await db.execute(
        "SELECT outcome, job_id, reason FROM jobsd.schedule_ticks WHERE schedule_id = 'full' "
        "ORDER BY tick"
    )
    rows = await cur.fetchall()
    assert [r["outcome"] for r in rows] == ["enqueued", "refused"]
    assert rows[1]["job_id"] is None and "capacity 1" in rows[1]["reason"]
    jobs = await ticks_of(db, "full")
    await db.execute("UPDATE jobsd.jobs SET status = 'cancelled' WHERE id = %s", (jobs[0]["id"],))

    clock.advance(60)  # 12:03: room again
    assert (await peers[1].run_once()).fired == 1
    jobs = await ticks_of(db, "full")
    assert [j["tick"] for j in jobs] == [
        datetime(2026, 6, 1, 12, 1, tzinfo=UTC),
        datetime(2026, 6, 1, 12, 3, tzinfo=UTC),
    ]
    state = await counters(db, "full")
    assert (state["fired"], state["refused"]) == (2, 1)
    async with pools[0].connection() as conn:
        [info] = await store.info(conn, "full")
    assert info.last_state == "queued" and info.last_job_id == jobs[1]["id"]


async def test_a_tick_into_an_unknown_queue_is_refused_not_retried(
    pools: list[AsyncPool], db: ADb
) -> None:
    every = Schedule.build(id="lost", type="t", org_id="acme", every="60s", queue="nowhere")
    clock = ManualClock(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    sched = scheduler(pools[0], clock, [every])
    await sched.run_once()
    clock.advance(60)
    assert (await sched.run_once()).refused == 1
    assert (await sched.run_once()).refused == 0
    async with pools[0].connection() as conn:
        [info] = await store.info(conn, "lost")
    assert info.last_state == "refused" and "unknown queue 'nowhere'" in (info.last_reason or "")
    assert await ticks_of(db, "lost") == []


async def test_a_dedup_key_makes_a_tick_find_the_job_still_pending(
    pools: list[AsyncPool], db: ADb
) -> None:
    every = Schedule.build(id="d", type="t", org_id="acme", every="60s", dedup_key="one-at-a-time")
    clock = ManualClock(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    sched = scheduler(pools[0], clock, [every])
    await sched.run_once()
    for _ in range(2):
        clock.advance(60)
        assert (await sched.run_once()).fired == 1
    jobs = await ticks_of(db, "d")
    assert len(jobs) == 1  # the second tick found the first job holding the key
    cur = await db.execute(
        "SELECT outcome, job_id FROM jobsd.schedule_ticks WHERE schedule_id = 'd' ORDER BY tick"
    )
    assert [(r["outcome"], r["job_id"]) for r in await cur.fetchall()] == [
        ("enqueued", jobs[0]["id"]),
        ("existing", jobs[0]["id"]),
    ]


async def test_a_payload_over_the_size_limit_is_an_error_at_start(pools: list[AsyncPool]) -> None:
    big = Schedule.build(id="big", type="t", org_id="acme", every="60s", payload={"x": "y" * 100})
    with pytest.raises(ConfigError, match=r"schedule 'big': payload is .* over the limit"):
        scheduler(pools[0], ManualClock(), [big], max_payload_bytes=50)


async def test_a_redeclared_schedule_keeps_its_state(pools: list[AsyncPool], db: ADb) -> None:
    first = Schedule.build(id="r", type="t", org_id="acme", every="60s")
    clock = ManualClock(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    await scheduler(pools[0], clock, [first]).run_once()
    clock.advance(60)
    await scheduler(pools[0], clock, [first]).run_once()
    changed = Schedule.build(id="r", type="t2", org_id="acme", every="120s")
    clock.advance(60)  # 12:02: a tick of both definitions
    done = await scheduler(pools[1], clock, [changed]).run_once()
    assert done.fired == 1
    async with pools[0].connection() as conn:
        [info] = await store.info(conn, "r")
    assert (info.type, info.every_ms, info.fired) == ("t2", 120_000, 2)
    assert uuid.UUID(str(info.last_job_id))


async def test_a_deleted_schedule_row_is_declared_again(pools: list[AsyncPool], db: ADb) -> None:
    every = Schedule.build(id="gone", type="t", org_id="acme", every="60s")
    clock = ManualClock(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    sched = scheduler(pools[0], clock, [every])
    await sched.run_once()
    await db.execute("DELETE FROM jobsd.schedules WHERE id = 'gone'")
    clock.advance(60)
    assert (await sched.run_once()).fired == 0  # nothing to fire from; noticed
    clock.advance(1)
    assert (await sched.run_once()).fired == 0  # declared again, as new: from now on
    clock.advance(60)
    assert (await sched.run_once()).fired == 1
    assert [j["tick"] for j in await ticks_of(db, "gone")] == [
        datetime(2026, 6, 1, 12, 2, tzinfo=UTC)
    ]


async def test_a_conflicting_transaction_leaves_the_tick_to_the_next_pass(
    pools: list[AsyncPool], db: ADb, monkeypatch: pytest.MonkeyPatch
) -> None:
    every = Schedule.build(id="c", type="t", org_id="acme", every="60s")
    clock = ManualClock(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    sched = scheduler(pools[0], clock, [every])
    await sched.run_once()
    clock.advance(60)
    real = store.fire_tick

    async def conflict(*args: Any, **kwargs: Any) -> Any:
        raise TransientConflict("tick of schedule 'c' failed: conflict, retry")

    monkeypatch.setattr(store, "fire_tick", conflict)
    assert (await sched.run_once()).fired == 0  # logged, not fatal
    monkeypatch.setattr(store, "fire_tick", real)
    assert (await sched.run_once()).fired == 1
    assert [j["tick"] for j in await ticks_of(db, "c")] == [datetime(2026, 6, 1, 12, 1, tzinfo=UTC)]


async def test_run_sleeps_until_each_next_tick(pools: list[AsyncPool], db: ADb) -> None:
    every = Schedule.build(id="run", type="t", org_id="acme", every="5s")
    start = datetime(2026, 6, 1, 12, 0, 1, tzinfo=UTC)
    clock = ManualClock(start)  # each sleep of the loop moves it on
    sched = scheduler(pools[0], clock, [every], interval_s=60.0)

    async def six_jobs() -> bool:
        return len(await ticks_of(db, "run")) >= 6

    async with anyio.create_task_group() as tg:
        await tg.start(sched.run)
        await wait_until(six_jobs, what="six ticks fired by run()", timeout_s=20)
        tg.cancel_scope.cancel()
    jobs = await ticks_of(db, "run")
    assert [j["tick"] for j in jobs[:6]] == [start + timedelta(seconds=4 + 5 * n) for n in range(6)]
    assert all(0 < s <= 5.01 for s in clock.slept)  # woke at each tick, not at the interval
    state = await counters(db, "run")
    assert (state["late"], state["skipped"]) == (0, 0)
