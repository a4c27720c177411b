"""Rescue running jobs whose owner died or stopped heartbeating.

Model: a running job carries its owner's heartbeat in ``progress.updated_at`` (else
``started_at``). When that is older than ``stale_after``, the owner is taken for dead
or hung: the job goes back to ``queued`` while its type allows another attempt, else
it fails for good with ``max attempts exceeded`` and its ``on_fail`` hook runs. The
rescue clears the lease, so a late report from the old owner is discarded. Many
daemons may sweep at once: rows are taken with SKIP LOCKED.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable
from datetime import datetime

import anyio

from jobsd.errors import BackendUnavailable
from jobsd.models import Job
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
        """Do one pass; return how many jobs went to each status. Safe to repeat."""
        async with acquire(self.pool, "sweep") as conn:
            jobs = await queries.sweep_stale(
                conn,
                worker_id=self.settings.worker_id,
                stale_after_s=self.settings.stale_after,
                max_attempts=self.registry.max_attempts(),
                default_max_attempts=self.settings.default_max_attempts,
                now=now,
            )
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
        """Sweep at start, then every ``sweep_interval`` (jittered), until cancelled."""
        while True:
            try:
                await self.run_once()
            except BackendUnavailable as exc:
                log.warning("sweeper.failed", extra={"error": str(exc)})
            interval = self.settings.sweep_interval
            await anyio.sleep(random.uniform(0.8 * interval, 1.2 * interval))
