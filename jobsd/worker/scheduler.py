"""Fire the ticks of periodic jobs: each tick of each schedule enqueues one job.

Model: every daemon with ``JOBSD_SCHEDULER=true`` runs a scheduler over the same
schedules; they need not know of each other. A pass reads the database's time and,
per schedule, the time after which its ticks may fire (its creation, last tick,
resume, or skipped ticks), plans the ticks due up to now (``periodic.plan_ticks``:
on-time ticks fire, missed ones follow the schedule's ``catch_up``), then fires
each one with ``store.schedules.fire_tick``: the tick's row, keyed by (schedule,
tick), is inserted in the transaction of the job's enqueue, so of all the
schedulers one takes the tick and the others find it taken. A refused enqueue (full
or unknown queue, bad payload) takes the tick too: it is logged, counted, and the
next tick fires as usual, with no retry. Paused schedules fire nothing; a resumed
one starts at its next tick. Between passes the scheduler sleeps until the next
tick of any schedule, at most ``interval_s`` (jittered).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import anyio
from anyio.abc import TaskStatus

from jobsd.errors import ConfigError, InvalidPayload, TransientConflict
from jobsd.jobspec import JobSpec
from jobsd.periodic import Schedule, plan_ticks
from jobsd.store import schedules as store
from jobsd.store.db import AsyncConn, AsyncPool, acquire
from jobsd.worker.clock import Clock
from jobsd.worker.loop import jitter, run_loop

__all__ = ["Scheduler", "SchedulerPass", "SchedulerSettings"]

log = logging.getLogger(__name__)

# a wake-up this long after a tick, so that the tick is due when the pass runs
_AFTER_TICK_S = 0.005


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """Who fires, how late a tick may be before it counts as missed, how often to look."""

    worker_id: str
    interval_s: float = 10.0
    grace_s: float = 60.0
    catch_up_max: int = 100
    max_payload_bytes: int | None = None


@dataclass(slots=True)
class SchedulerPass:
    """What one pass did."""

    fired: int = 0
    """ticks that enqueued a job (or found the one holding its dedup key)"""
    refused: int = 0
    late: int = 0
    """ticks fired after they were missed (catch-up)"""
    skipped: int = 0
    """missed ticks left unfired by the catch-up policy"""
    taken: int = 0
    """ticks another scheduler had fired already"""
    next_tick: datetime | None = None
    now: datetime | None = None


class Scheduler:
    """Enqueue one job per tick of each schedule, with any number of peers."""

    def __init__(
        self,
        pool: AsyncPool,
        cfg: SchedulerSettings,
        clock: Clock,
        schedules: Sequence[Schedule],
    ) -> None:
        self.pool = pool
        self.cfg = cfg
        self.clock = clock
        self.schedules = {s.id: s for s in schedules}
        self._declared = False
        self._wait_s = cfg.interval_s
        for schedule in schedules:
            # a payload over the size limit would refuse every tick: say so at start
            try:
                self._spec(schedule, datetime(2000, 1, 1, tzinfo=UTC))
            except (InvalidPayload, ValueError) as exc:
                raise ConfigError(f"schedule {schedule.id!r}: {exc}") from None

    def _spec(self, schedule: Schedule, tick: datetime) -> JobSpec:
        return JobSpec.build(
            schedule.type,
            schedule.job_payload(tick),
            org_id=schedule.org_id,
            max_payload_bytes=self.cfg.max_payload_bytes,
            queue=schedule.queue,
            priority=schedule.priority,
            dedup_key=schedule.dedup_key,
            concurrency_key=schedule.concurrency_key,
        )

    async def run_once(self) -> SchedulerPass:
        """Fire every tick due now (declaring the schedules on the first pass). Safe to repeat."""
        done = SchedulerPass()
        if not self.schedules:
            return done
        sql_now = self.clock.sql_now()
        async with acquire(self.pool, "scheduler pass") as conn:
            if not self._declared:
                await store.upsert(conn, [s.row() for s in self.schedules.values()], sql_now)
                self._declared = True
                log.info("scheduler.declared", extra={"schedules": sorted(self.schedules)})
            now, states = await store.state(conn, list(self.schedules), sql_now)
            done.now = now
            if len(states) < len(self.schedules):
                # a row was deleted under us: declare again on the next pass
                self._declared = False
            for state in states:
                schedule = self.schedules[state.id]
                if state.paused:
                    continue
                plan = plan_ticks(
                    schedule,
                    since=state.since,
                    now=now,
                    grace_s=self.cfg.grace_s,
                    catch_up_max=self.cfg.catch_up_max,
                )
                if plan.skipped_until is not None and await store.skip(
                    conn, schedule.id, plan.skipped, plan.skipped_until
                ):
                    done.skipped += plan.skipped
                    log.warning(
                        "schedule.skipped",
                        extra={
                            "schedule_id": schedule.id,
                            "skipped": plan.skipped,
                            "until": plan.skipped_until.isoformat(),
                            "catch_up": schedule.catch_up,
                        },
                    )
                try:
                    for tick, late in plan.fire:
                        await self._fire(conn, schedule, tick, late, sql_now, done)
                except TransientConflict as exc:
                    # rolled back, nothing taken: the next pass fires the tick
                    log.warning(
                        "schedule.conflict", extra={"schedule_id": schedule.id, "error": str(exc)}
                    )
            upcoming = [self.schedules[s.id].next_tick(now) for s in states if not s.paused] or [
                now + timedelta(seconds=self.cfg.interval_s)
            ]
        done.next_tick = min(upcoming)
        self._wait_s = (done.next_tick - now).total_seconds() + _AFTER_TICK_S
        return done

    async def _fire(
        self,
        conn: AsyncConn,
        schedule: Schedule,
        tick: datetime,
        late: bool,
        sql_now: datetime | None,
        done: SchedulerPass,
    ) -> None:
        outcome = await store.fire_tick(
            conn,
            schedule_id=schedule.id,
            tick=tick,
            late=late,
            spec=self._spec(schedule, tick),
            worker_id=self.cfg.worker_id,
            now=sql_now,
        )
        if outcome is None:
            done.taken += 1
            return
        extra = {"schedule_id": schedule.id, "tick": tick.isoformat(), "late": late}
        if outcome.job is None:
            done.refused += 1
            log.warning("schedule.refused", extra={**extra, "reason": outcome.reason})
            return
        done.fired += 1
        done.late += late
        log.info(
            "schedule.fired",
            extra={**extra, "job_id": str(outcome.job.id), "outcome": outcome.outcome},
        )

    async def wait(self) -> None:
        """Sleep until the next tick, at most ``interval_s`` (jittered)."""
        await self.clock.sleep(max(0.0, min(self._wait_s, jitter(self.cfg.interval_s))))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Pass, sleep until the next tick, pass again, until cancelled."""
        await run_loop("scheduler", self.run_once, self.wait, self.clock, task_status=task_status)
