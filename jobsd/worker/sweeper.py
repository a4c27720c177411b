"""Rescue running jobs whose owner died or stopped heartbeating.

Model: every daemon holds a session advisory lock for its worker id while it lives
(``lifeline.py``). Every ``death_check_interval`` (jittered) the sweeper tries the
lock of each other registered worker; one it can take is dead, proven: its running
jobs are rescued at once and its row deleted. Owners that are alive but hung are caught by
the heartbeat: a running job whose ``progress.updated_at`` (else ``started_at``) is
older than ``stale_after`` is rescued too (checked at start, then every
``sweep_interval``, jittered).

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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import anyio
from anyio.abc import TaskStatus

from jobsd.models import Job
from jobsd.registry import Registry
from jobsd.store import queries
from jobsd.store.db import AsyncPool, acquire
from jobsd.worker.clock import Clock
from jobsd.worker.loop import pause, run_loop
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


class Sweeper:
    """Requeue or fail stale running jobs."""

    def __init__(
        self,
        pool: AsyncPool,
        cfg: SweeperSettings,
        clock: Clock,
        registry: Registry,
        stats: DaemonStats,
        on_failed: Callable[[Job], None],
        recoverer: Recoverer | None = None,
    ) -> None:
        self.recoverer = recoverer or Recoverer(
            pool,
            RecovererSettings(cfg.worker_id, cfg.recover_timeout_s),
            clock,
            registry,
            on_failed,
        )
        self.pool = pool
        self.cfg = cfg
        self.clock = clock
        self.registry = registry
        self.stats = stats
        self.on_failed = on_failed

    async def run_once(self, *, now: datetime | None = None) -> SweepCounts:
        """Do one pass (dead owners, then stale heartbeats); return how many jobs went
        to each status. Safe to repeat. ``now`` overrides the clock's."""
        counts = await self.check_deaths()
        counts.update(await self.sweep_stale(now=now))
        return counts

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Sweep at start, then check deaths every ``death_check_interval_s`` and
        heartbeats every ``sweep_interval_s`` (both jittered), until cancelled."""
        async with anyio.create_task_group() as tg:
            for operation, step, interval_s in (
                ("death check", self.check_deaths, self.cfg.death_check_interval_s),
                ("sweep", self.sweep_stale, self.cfg.sweep_interval_s),
            ):
                wait = pause(interval_s, self.clock)
                tg.start_soon(run_loop, operation, step, wait, self.clock)
            task_status.started()

    async def check_deaths(self) -> SweepCounts:
        """Rescue the jobs of every registered worker whose lock is free; return counts."""
        async with acquire(self.pool, "death check") as conn:
            found = await queries.sweep_dead_workers(
                conn,
                worker_id=self.cfg.worker_id,
                max_attempts=self.registry.max_attempts(),
                delivery=self.registry.deliveries(),
                default_max_attempts=self.cfg.default_max_attempts,
            )
        for dead in found.dead_workers:
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
        (as of ``now``, else the clock's)."""
        async with acquire(self.pool, "sweep") as conn:
            jobs = await queries.sweep_stale(
                conn,
                worker_id=self.cfg.worker_id,
                stale_after_s=self.cfg.stale_after_s,
                max_attempts=self.registry.max_attempts(),
                delivery=self.registry.deliveries(),
                default_max_attempts=self.cfg.default_max_attempts,
                now=now if now is not None else self.clock.sql_now(),
            )
        return await self._rescued(jobs)
