"""Rescue running jobs whose owner died or stopped heartbeating.

Model: every daemon holds a session advisory lock for its worker id while it lives
(``lifeline.py``). Every ``death_check_interval`` the sweeper tries the lock of each
other registered worker; one it can take is dead, proven: its running jobs are
rescued at once and its row deleted. Owners that are alive but hung are caught by
the heartbeat: a running job whose ``progress.updated_at`` (else ``started_at``) is
older than ``stale_after`` is rescued too (checked every ``sweep_interval``).

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

import inspect
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import assert_never

import anyio
import anyio.to_thread

from jobsd.errors import BackendUnavailable
from jobsd.models import Job
from jobsd.recovery import AMBIGUOUS, Recovery
from jobsd.registry import Registry
from jobsd.settings import Settings
from jobsd.store import queries
from jobsd.store.db import AsyncPool, acquire
from jobsd.worker.stats import DaemonStats

__all__ = ["Sweeper"]

log = logging.getLogger(__name__)


class Sweeper:
    """Requeue or fail stale running jobs."""

    def __init__(
        self,
        pool: AsyncPool,
        settings: Settings,
        registry: Registry,
        stats: DaemonStats,
        on_failed: Callable[[Job], None],
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.registry = registry
        self.stats = stats
        self.on_failed = on_failed

    async def run_once(self, *, now: datetime | None = None) -> Counter[str]:
        """Do one pass (dead owners, then stale heartbeats); return how many jobs went
        to each status. Safe to repeat."""
        counts = await self.check_deaths()
        counts.update(await self.sweep_stale(now=now))
        return counts

    async def check_deaths(self) -> Counter[str]:
        """Rescue the jobs of every registered worker whose lock is free; return counts."""
        async with acquire(self.pool, "death check") as conn:
            found = await queries.sweep_dead_workers(
                conn,
                worker_id=self.settings.worker_id,
                max_attempts=self.registry.max_attempts(),
                delivery=self.registry.deliveries(),
                default_max_attempts=self.settings.default_max_attempts,
            )
        for dead in found.dead_workers:
            log.info("worker.dead", extra={"dead_worker_id": dead})
        return await self._rescued(found.jobs)

    async def _rescued(self, jobs: list[Job]) -> Counter[str]:
        settled = []
        for job in jobs:
            if job.status == "recovery_required":
                settled.append(await self._recover(job))
            else:
                settled.append(job)
        return self._count(settled)

    async def _recover(self, job: Job) -> Job:
        """Ask the type's recover hook what became of a job whose owner died; apply it.

        The job is already ``recovery_required``: a hook that fails, hangs (30 s) or
        answers ``AMBIGUOUS`` leaves it there for an operator (``jobsd resolve``).
        """
        spec = self.registry.get(job.type)
        if spec is None or spec.recover is None:
            return job
        hook = spec.recover
        answer: Recovery = AMBIGUOUS
        try:
            with anyio.fail_after(30):
                if inspect.iscoroutinefunction(hook):
                    answer = await hook(job)
                else:
                    result = await anyio.to_thread.run_sync(hook, job)
                    answer = await result if inspect.isawaitable(result) else result
            if not isinstance(answer, Recovery):
                raise TypeError(f"recover hook returned {answer!r}, not a Recovery")
        except Exception:
            log.error("job.recover_failed", extra={"job_id": str(job.id)}, exc_info=True)
            return job
        match answer.action:
            case "ambiguous":
                log.info("job.recovery_required", extra={"job_id": str(job.id)})
                return job
            case "succeeded":
                status, reason, error = "succeeded", "recovered_after_publish", None
            case "rerun":
                if job.attempts < spec.max_attempts:
                    status, reason, error = "queued", "recovered: rerun", None
                else:
                    status, reason = "failed", "max attempts exceeded"
                    error = "max attempts exceeded"
            case _:
                assert_never(answer.action)
        async with acquire(self.pool, "recover") as conn:
            written = await queries.resolve_job(
                conn,
                job.id,
                status=status,
                reason=reason,
                actor=self.settings.worker_id,
                report=answer.report,
                error=error,
            )
        return written or job

    def _count(self, jobs: list[Job]) -> Counter[str]:
        counts: Counter[str] = Counter()
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

    async def run(self) -> None:
        """Sweep at start, then check deaths every ``death_check_interval`` and
        heartbeats every ``sweep_interval`` (both jittered), until cancelled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._loop, self.check_deaths, self.settings.death_check_interval)
            tg.start_soon(self._loop, self.sweep_stale, self.settings.sweep_interval)

    async def sweep_stale(self, *, now: datetime | None = None) -> Counter[str]:
        """Rescue the running jobs whose heartbeat is older than ``stale_after``."""
        async with acquire(self.pool, "sweep") as conn:
            jobs = await queries.sweep_stale(
                conn,
                worker_id=self.settings.worker_id,
                stale_after_s=self.settings.stale_after,
                max_attempts=self.registry.max_attempts(),
                delivery=self.registry.deliveries(),
                default_max_attempts=self.settings.default_max_attempts,
                now=now,
            )
        return await self._rescued(jobs)

    async def _loop(self, step: Callable[[], Awaitable[Counter[str]]], interval: float) -> None:
        while True:
            try:
                await step()
            except BackendUnavailable as exc:
                log.warning("sweeper.failed", extra={"error": str(exc)})
            await anyio.sleep(random.uniform(0.8 * interval, 1.2 * interval))
