"""Claim queued jobs in batches and start their handlers.

Model: the claimer sleeps until something may have changed: a NOTIFY for one of its
queues, a reconnect of the LISTEN connection, or the poll timer (jittered around
``poll_interval``, so a lost notification costs at most one interval). Then it claims
as many jobs as it has free slots, oldest first, in one statement with SKIP LOCKED.
A round that fills every free slot means more work is likely waiting: the claimer
goes again as soon as a slot frees, without waiting for a wake-up. On poll ticks (and
after a notification that found no work, which may announce a job scheduled for later)
it also promotes due ``scheduled`` jobs, and it shortens its sleep to the next due time,
so a job scheduled for later starts on time without the table being polled for it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime

import anyio

from jobsd.models import Job
from jobsd.registry import Registry
from jobsd.settings import Settings
from jobsd.store import queries
from jobsd.store.db import AsyncPool, acquire, transient_retries
from jobsd.worker.holdings import Holdings
from jobsd.worker.stats import DaemonStats
from jobsd.worker.waker import Waker

__all__ = ["Claimer"]

log = logging.getLogger(__name__)


class Claimer:
    """Fill free slots with claimed jobs; ``start_job`` runs each one."""

    def __init__(
        self,
        pool: AsyncPool,
        settings: Settings,
        registry: Registry,
        holdings: Holdings,
        waker: Waker,
        stats: DaemonStats,
        start_job: Callable[[Job], None],
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.registry = registry
        self.holdings = holdings
        self.waker = waker
        self.stats = stats
        self.start_job = start_job
        self._next_due: float | None = None  # monotonic time of the next scheduled job
        self._last_promote = 0.0

    async def run(self) -> None:
        """Claim until cancelled; the first round runs at once."""
        more = True
        cause = "start"
        while True:
            await self.holdings.wait_free()
            if not more:
                cause = await self.waker.wait(self._sleep_s())
            self.stats.wakeups[cause] += 1
            promoted = cause in ("poll", "start", "reconnect", "scheduled") or self._promotion_due()
            if promoted:
                await self.promote()
            more = await self.claim_once()
            if cause == "notify" and not more and not promoted:
                # The notification may announce a job scheduled for later: learn its due
                # time now rather than at the next poll. Under load rounds fill every
                # slot and skip this.
                await self.promote()
            cause = "more"

    async def claim_once(self) -> bool:
        """Claim up to the free slots and start the jobs; return True to claim again at once.

        Again at once: every slot was filled (more work is likely waiting), or jobs were
        left behind a concurrency key this round just started (the next round skips it).
        """
        want = self.holdings.free
        if want <= 0:
            return True
        jobs = queries.ClaimRound([])
        async for attempt in transient_retries("claim"):
            # Shielded: a stop arriving while the claim is in flight must not lose jobs
            # it committed as ours; they are started, then the stop takes effect. The
            # back-off between attempts stays cancellable.
            with attempt, anyio.CancelScope(shield=True):
                async with acquire(self.pool, "claim") as conn:
                    jobs = await queries.claim_batch(
                        conn,
                        limit=want,
                        worker_id=self.settings.worker_id,
                        queues=self.settings.queues or None,
                        keep_dedup_types=self.registry.keep_dedup_types(),
                        key_limits=self.registry.concurrency_limits(),
                    )
                for job in jobs:
                    self.stats.claimed[job.type] += 1
                    self.start_job(job)
        if jobs:
            log.debug("claimer.claimed", extra={"count": len(jobs), "wanted": want})
        return len(jobs) == want or jobs.left_for_busy_keys

    async def promote(self) -> int:
        """Move due scheduled jobs to queued and remember when the next one is due."""
        self._last_promote = time.monotonic()
        async for attempt in transient_retries("promote"):
            with attempt:
                async with acquire(self.pool, "promotion") as conn:
                    result = await queries.promote_due(conn)
        if result.next_due is None:
            self._next_due = None
        else:
            delay = (result.next_due - datetime.now(UTC)).total_seconds()
            self._next_due = time.monotonic() + max(delay, 0.0)
        if result.promoted:
            log.info("claimer.promoted", extra={"count": result.promoted})
        return result.promoted

    def _promotion_due(self) -> bool:
        now = time.monotonic()
        if now - self._last_promote >= self.settings.poll_interval:
            return True
        return self._next_due is not None and now >= self._next_due

    def _sleep_s(self) -> float:
        interval = self.settings.poll_interval
        sleep = random.uniform(interval * 2 / 3, interval * 4 / 3)
        if self._next_due is not None:
            sleep = min(sleep, max(self._next_due - time.monotonic(), 0.0) + 0.005)
        return sleep
