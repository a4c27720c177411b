"""Rescue running jobs whose owner died or stopped answering.

Model: every daemon holds a session advisory lock for its worker id and renews a lease
(``alive_until``) while it lives (``lifeline.py``). Every ``death_check_interval``
(jittered) the sweeper looks for other registered workers whose lease is over and
whose lock it can take: those are dead, proven (a live daemon whose lock's connection
was lost takes it again within its lease, or stops its runs first: ``fence.py``);
their running jobs are rescued at once and their rows deleted. Owners that hold their
lock but stopped renewing their lease (a process stopped, or cut off from the
database) have their running jobs rescued once the lease ended more than
``stale_after`` ago (checked at start, then every ``sweep_interval``, jittered). A
handler's own silence is not its owner's death: timeouts and stall limits end it.
Leases are stamped and judged on the database's clock; before each stale sweep the
sweeper checks that clock against its own monotonic one (``clockwatch.py``), and after
a forward step it holds off stale rescues for ``stale_after``, until every live owner
has renewed again.

A rescue follows the type's delivery. ``at_least_once``: back to ``queued`` while
attempts remain, else ``failed`` with ``max attempts exceeded``. ``at_most_once``:
never run again, ``failed`` with ``worker lost``, or, when the type has a
``recover`` hook, ``recovery_required`` and then whatever the hook answers
(``succeeded`` with reason ``recovered_after_publish``, stays ``recovery_required``,
or a re-run). A failed job's ``on_fail`` hook runs. The rescue clears the lease, so
a late report from the old owner is discarded.
Many daemons may sweep at once: rows are taken with SKIP LOCKED, worker locks with
``pg_try_advisory_xact_lock``.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

import anyio
from anyio.abc import TaskStatus

from jobsd.errors import BackendUnavailable, DatabaseError
from jobsd.models import Job
from jobsd.registry import Registry
from jobsd.store import queries
from jobsd.store.db import AsyncPool, acquire, cause_of
from jobsd.worker.clock import Clock
from jobsd.worker.clockwatch import DbClockWatch, Reading
from jobsd.worker.decide import rescuer, rules_from
from jobsd.worker.executor import failure
from jobsd.worker.loop import pause, run_loop
from jobsd.worker.outcome import error_record_of
from jobsd.worker.recoverer import Recoverer, RecovererSettings
from jobsd.worker.stats import DaemonStats

__all__ = ["SweepCounts", "Sweeper", "SweeperSettings"]

log = logging.getLogger(__name__)

SweepCounts = Counter[str]
"""how many jobs a pass moved to each status"""


@dataclass(frozen=True, slots=True)
class SweeperSettings:
    """Who sweeps, how often, and what counts as stale."""

    worker_id: str
    death_check_interval_s: float
    sweep_interval_s: float
    stale_after_s: float
    default_max_attempts: int
    """for a job whose type has no handler here"""
    recover_timeout_s: float = 30.0
    """how long a type's ``recover`` hook may take"""


@dataclass(eq=False, repr=False)
class Sweeper:
    """Requeue or fail stale running jobs."""

    pool: AsyncPool
    cfg: SweeperSettings
    clock: Clock
    registry: Registry
    stats: DaemonStats
    on_failed: Callable[[Job], None]
    recoverer: Recoverer | None = None
    """settles ``recovery_required`` jobs (the daemon's); None: its own, made when first needed"""
    clock_watch: DbClockWatch = field(init=False)
    _intervals: dict[str, float] = field(init=False)
    _passed_at: dict[str, float] = field(init=False)
    _rescue: queries.RescueDecider = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.cfg
        # a step of the database's clock within a tenth of the lease cannot push a
        # live owner's heartbeat (at most ~0.8 of the lease old) past it
        self.clock_watch = DbClockWatch(hold_s=cfg.stale_after_s, slack_s=cfg.stale_after_s / 10)
        # each kind of pass, its interval, and when it last ended without the database
        # refusing it
        self._intervals = {
            "death check": cfg.death_check_interval_s,
            "sweep": cfg.sweep_interval_s,
        }
        self._passed_at = dict.fromkeys(self._intervals, self.clock.monotonic())
        self._rescue = rescuer(
            rules_from(self.registry, default_max_attempts=cfg.default_max_attempts)
        )

    def stalled(self, bound_s: float) -> bool:
        """Say whether a kind of pass (death check, sweep) has not completed for more than
        ``bound_s``, or three of its intervals when longer (the database away, or
        refusing every pass): the watchdog then stops pinging."""
        now = self.clock.monotonic()
        return any(
            now - at > max(bound_s, 3 * self._intervals[kind])
            for kind, at in self._passed_at.items()
        )

    async def run_once(self, *, now: datetime | None = None) -> SweepCounts:
        """Do one pass (dead owners, then unresponsive ones); return how many jobs went
        to each status. Safe to repeat. ``now`` overrides the clock's."""
        counts = await self.check_deaths()
        counts.update(await self.sweep_stale(now=now))
        return counts

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Sweep at start, then check deaths every ``death_check_interval_s`` and
        heartbeats every ``sweep_interval_s`` (both jittered), until cancelled."""
        async with anyio.create_task_group() as tg:
            steps = {"death check": self.check_deaths, "sweep": self.sweep_stale}
            for operation, interval_s in self._intervals.items():
                step = self._survive(steps[operation], operation)
                wait = pause(interval_s, self.clock)
                tg.start_soon(run_loop, operation, step, wait, self.clock)
            task_status.started()

    def _survive(
        self, step: Callable[[], Awaitable[SweepCounts]], kind: str = "sweep"
    ) -> Callable[[], Awaitable[SweepCounts]]:
        """Wrap a pass so that a statement the database refuses (poison, not an outage)
        is logged with its cause and the pass tried again at the next interval, not
        retried at once forever, nor the end of the daemon. A pass that completes is
        recorded for ``stalled``."""

        async def guarded() -> SweepCounts:
            try:
                counts = await step()
            except BackendUnavailable:
                raise
            except DatabaseError as exc:
                self.stats.sweeps_refused += 1
                log.error("sweeper.refused", extra={"error": cause_of(exc)}, exc_info=True)
                return Counter()
            self._passed_at[kind] = self.clock.monotonic()
            return counts

        return guarded

    async def check_deaths(self) -> SweepCounts:
        """Rescue the jobs of every registered worker whose lock is free; return counts."""
        async with acquire(self.pool, "death check") as conn:
            found = await queries.sweep_dead_workers(
                conn, worker_id=self.cfg.worker_id, decide=self._rescue
            )
        for dead in found.dead_workers:
            self.stats.deaths += 1
            log.info("worker.dead", extra={"dead_worker_id": dead})
        return await self._rescued(found.jobs)

    async def _rescued(self, jobs: list[Job]) -> SweepCounts:
        settled = []
        for job in jobs:
            if job.status == "recovery_required":
                settled.append(await self._recover(job))
            else:
                settled.append(job)
        return self._count(settled)

    async def _recover(self, job: Job) -> Job:
        """Ask the type's recover hook what became of a job whose owner died; apply it
        (``recoverer.py``)."""
        if self.recoverer is None:
            settings = RecovererSettings(self.cfg.worker_id, self.cfg.recover_timeout_s)
            self.recoverer = Recoverer(
                self.pool, settings, self.clock, self.registry, self.on_failed
            )
        return await self.recoverer.recover(job)

    def _count(self, jobs: list[Job]) -> SweepCounts:
        counts: SweepCounts = Counter()
        for job in jobs:
            counts[str(job.status)] += 1
            self.stats.swept[str(job.status)] += 1
            log.info(
                "job.rescued",
                extra={
                    "job_id": str(job.id),
                    "type": job.type,
                    "status": str(job.status),
                    "attempts": job.attempts,
                },
            )
            if job.status == "failed":
                self.on_failed(job)
        return counts

    async def sweep_stale(self, *, now: datetime | None = None) -> SweepCounts:
        """Rescue the running jobs whose heartbeat is older than ``stale_after_s``
        (as of ``now``, else the clock's).

        Without ``now`` the time is read first (the database's, or a pinned clock's)
        and checked by ``clock_watch``: while it holds off after a step of that clock,
        nothing is rescued. The sweep then judges by the time read. A pass the
        database refuses (poison, not an outage) is retaken one job at a time."""
        if now is None:
            async with acquire(self.pool, "sweep") as conn:
                before = self.clock.monotonic()
                now = self.clock.sql_now() or await queries.db_now(conn)
            reading = Reading(now, before, self.clock.monotonic())
            if not self.clock_watch.trust(reading):
                log.debug("sweeper.holding_off", extra={"db_now": now.isoformat()})
                return SweepCounts()
        try:
            jobs = await self._sweep(now, None)
        except BackendUnavailable:
            raise
        except DatabaseError as exc:
            log.error("sweeper.pass_refused", extra={"error": cause_of(exc)})
            jobs = await self._sweep_one_by_one(now)
        return await self._rescued(jobs)

    async def _sweep(self, now: datetime | None, only: uuid.UUID | None) -> list[Job]:
        async with acquire(self.pool, "sweep") as conn:
            return await queries.sweep_stale(
                conn,
                worker_id=self.cfg.worker_id,
                stale_after_s=self.cfg.stale_after_s,
                decide=self._rescue,
                now=now,
                only=only,
            )

    async def _sweep_one_by_one(self, now: datetime | None) -> list[Job]:
        """Rescue the stale jobs one at a time after the database refused them together
        (poison, not an outage); a job refused on its own is failed with the cause
        (reason ``rescue rejected``), so that it cannot hold back the others again."""
        async with acquire(self.pool, "sweep") as conn:
            stale = await queries.stale_jobs(conn, stale_after_s=self.cfg.stale_after_s, now=now)
        rescued: list[Job] = []
        for job_id, lease_id in stale:
            try:
                rescued.extend(await self._sweep(now, job_id))
            except BackendUnavailable:
                raise
            except DatabaseError as exc:
                failed = await self._fail_unrescuable(job_id, lease_id, exc)
                if failed is not None:
                    rescued.append(failed)
        return rescued

    async def _fail_unrescuable(
        self, job_id: uuid.UUID, lease_id: uuid.UUID | None, exc: DatabaseError
    ) -> Job | None:
        cause = f"rescue failed: {cause_of(exc)}"
        log.error("job.rescue_rejected", extra={"job_id": str(job_id), "error": cause})
        if lease_id is None:
            return None
        outcome = failure(cause, reason="rescue rejected")
        row = queries.FinishRow(
            job_id=job_id,
            lease_id=lease_id,
            status=outcome.status,
            report_json=outcome.report_json,
            error=outcome.error,
            reason=outcome.reason,
            progress=None,
            run_after=None,
            delay_s=None,
            error_record=error_record_of(outcome),
        )
        try:
            async with acquire(self.pool, "sweep") as conn:
                claimed = await queries.get_job(conn, job_id)
                written = await queries.finish_batch(conn, [row])
        except DatabaseError as again:
            if isinstance(again, BackendUnavailable):
                raise
            log.error("job.rescue_failed", extra={"job_id": str(job_id), "error": str(again)})
            return None
        finished = written.get(job_id)
        if finished is None or claimed is None:
            return None
        return finished.applied_to(claimed, row.report_json)
