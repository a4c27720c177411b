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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus

from jobsd.models import Job, JobStatus
from jobsd.registry import Registry
from jobsd.store import queries
from jobsd.store.db import AsyncConn, AsyncPool, acquire
from jobsd.worker.clock import Clock
from jobsd.worker.fence import Fence
from jobsd.worker.holdings import Holdings
from jobsd.worker.loop import jitter, run_loop
from jobsd.worker.stats import DaemonStats
from jobsd.worker.waker import Waker

__all__ = ["ClaimPass", "Claimer", "ClaimerSettings"]

log = logging.getLogger(__name__)

# wake-up causes after which due scheduled jobs are promoted before the claim
_PROMOTING_CAUSES = frozenset({"poll", "start", "reconnect", "scheduled"})


@dataclass(frozen=True, slots=True)
class ClaimerSettings:
    """Who claims, from which queues (empty: all), and the mean poll interval."""

    worker_id: str
    queues: tuple[str, ...]
    poll_interval_s: float
    known_types_only: bool = False
    """claim only the types the registry has handlers for (``JOBSD_UNKNOWN_TYPES=leave``,
    the daemon's default); False claims every type"""
    durable_claims: bool = False
    """``JOBSD_DURABLE_CLAIMS``: every claim waits for the disk at commit"""
    reserve_s: float = 2.0
    """how long a job reserved ahead of the free slots stays reserved in the database"""
    reconcile_s: float = 10.0
    """after a claim that failed (its answer may be lost), how long each pass first
    looks for running jobs of this worker that it does not hold (the first look comes
    however long the database stays away)"""


@dataclass(frozen=True, slots=True)
class ClaimPass:
    """What one pass did: jobs claimed (and started), jobs promoted, and whether to
    claim again at once."""

    claimed: int
    promoted: int
    more: bool


@dataclass(eq=False, repr=False)
class Claimer:
    """Fill free slots with claimed jobs; ``start_job`` runs each one."""

    pool: AsyncPool
    cfg: ClaimerSettings
    clock: Clock
    registry: Registry
    holdings: Holdings
    waker: Waker
    stats: DaemonStats
    start_job: Callable[[Job], None]
    fence: Fence | None = None
    """closed while the daemon's lease may run out: no claim then"""
    _next_due: float | None = field(default=None, init=False)
    """clock.monotonic() of the next scheduled job"""
    _last_promote: float = field(default=-float("inf"), init=False)
    _cause: str = field(default="start", init=False)
    _more: bool = field(default=True, init=False)
    _for_a_slot: bool = field(default=False, init=False)
    """the last round claimed ahead only (no free slot) and took fewer than it could"""
    _reconcile_until: float = field(default=-float("inf"), init=False)
    """clock.monotonic() until which passes look for the jobs of a lost claim answer"""
    _lost_booking: int = field(default=0, init=False)
    """the slots a failed claim booked: kept for the jobs it may have started, until the
    first look for them"""

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Claim until cancelled; the first pass runs at once."""
        self._cause, self._more = "start", True
        self.stats.wakeups["start"] += 1
        await run_loop("claim", self._pass, self._wait, self.clock, task_status=task_status)

    async def run_once(self, cause: str = "poll") -> ClaimPass:
        """Do one pass for a wake-up of ``cause``: promote due scheduled jobs when the
        cause or the time calls for it, then claim up to the free slots and start the jobs.
        """
        promoted = 0
        promote_first = cause in _PROMOTING_CAUSES
        if promote_first:
            promoted = await self.promote()
        claimed, more = await self._claim()
        # Otherwise the claim goes first (a notification is about a job to start now:
        # the pickup must not wait for a promotion's round trip) and the promotion after:
        # when its time has come, or after a notification that found no work, which may
        # announce a job scheduled for later (learn its due time now rather than at the
        # next poll; under load rounds fill every slot and skip this).
        if not promote_first and (self._promotion_due() or (cause == "notify" and not more)):
            promoted = await self.promote()
            more = more or promoted > 0  # claim the promoted jobs at once
        return ClaimPass(claimed, promoted, more)

    async def _pass(self) -> None:
        self._more = (await self.run_once(self._cause)).more

    async def _wait(self) -> None:
        if self.fence is not None and not self.fence.open:
            await self.fence.wait_open()
            self._cause = "fence"
            self.stats.wakeups[self._cause] += 1
            return
        await self.holdings.wait_claimable()
        if self._more:
            self._cause = "more"
        elif self._for_a_slot:
            # the last round had no free slot: jobs only a free slot may take (keyed, at
            # most once) may have been left behind; claim again when one frees, or at
            # the next wake-up if that comes first, not a poll away
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._wake_when_a_slot_frees)
                self._cause = await self.waker.wait(self._sleep_s())
                tg.cancel_scope.cancel()
        else:
            self._cause = await self.waker.wait(self._sleep_s())
        self.stats.wakeups[self._cause] += 1

    async def _wake_when_a_slot_frees(self) -> None:
        await self.holdings.wait_free()
        self.waker.wake("slot")

    async def _claim(self) -> tuple[int, bool]:
        """Claim up to the free slots and start the jobs; return how many, and True to
        claim again at once.

        Again at once: every slot was filled (more work is likely waiting), or jobs were
        left behind a concurrency key this round just started (the next round skips it).
        """
        if self.fence is not None and not self.fence.open:
            return 0, False
        # the first look after a failed claim happens however long the database was
        # away: it gives back the slots that claim booked
        if self._lost_booking or self.clock.monotonic() < self._reconcile_until:
            await self.adopt_lost()
        want = self.holdings.claimable
        if want <= 0:
            return 0, True
        # A stop that arrived earlier in this pass takes effect here, before the shield:
        # psycopg may turn the cancellation of a query it was running (the promotion)
        # into an error instead of passing it on, and a cancelled scope is noticed again
        # only at the next checkpoint. Without this, a pass could claim after the stop.
        await anyio.lowlevel.checkpoint()
        # the free slots no reserved job waits for are this claim's while it is in
        # flight (the starter must not fill them meanwhile): the jobs it starts take
        # them, the rest are given back
        booked = self.holdings.book(max(self.holdings.free - self.holdings.waiting, 0))
        used = 0
        # Shielded: a stop arriving while the claim is in flight must not lose jobs it
        # committed as ours; they are started, then the stop takes effect. The back-off
        # of a retry (outside this pass) stays cancellable.
        try:
            with anyio.CancelScope(shield=True):
                async with acquire(self.pool, "claim") as conn:
                    jobs = await queries.claim_batch(
                        conn,
                        limit=want,
                        free=booked,
                        types=self.registry.types() if self.cfg.known_types_only else None,
                        **self._claim_args(),
                    )
                for job in jobs:
                    self.stats.claimed[self.stats.label(job.type)] += 1
                    used += job.status is JobStatus.RUNNING
                    self.start_job(job)
        except BaseException:
            # the claim may have committed with its answer lost: its jobs would be
            # running under this worker with no handler; look for them for a while, and
            # keep their slots until the first look
            self._reconcile_until = self.clock.monotonic() + self.cfg.reconcile_s
            self._lost_booking += booked - used
            raise
        else:
            self.holdings.unbook(booked - used)
        self._for_a_slot = booked == 0 and len(jobs) < want
        if jobs:
            log.debug("claimer.claimed", extra={"count": len(jobs), "wanted": want})
            # Let the runs just started reach their handlers before this pass sends
            # anything more: on a small machine the database's work on the next statement
            # (a promotion) would take the CPU from them, a third of an idle pickup.
            await anyio.lowlevel.checkpoint()
        return len(jobs), len(jobs) == want or jobs.left_for_busy_keys

    async def prepare(self, conn: AsyncConn) -> None:
        """Prepare the claim on a new connection of the pool, so that its first claims
        are not planned: they would start jobs later (``queries.prepare_claim``)."""
        slots = self.holdings.slots
        await queries.prepare_claim(conn, limit=slots, free=slots, **self._claim_args())

    def _claim_args(self) -> dict[str, Any]:
        return {
            "worker_id": self.cfg.worker_id,
            "queues": self.cfg.queues or None,
            "keep_dedup_types": self.registry.keep_dedup_types(),
            "key_limits": self.registry.concurrency_limits(),
            "at_most_once_types": self.registry.at_most_once_types(),
            "durable": self.cfg.durable_claims,
            "reserve_s": self.cfg.reserve_s,
        }

    async def adopt_lost(self) -> int:
        """Start the handlers of running jobs of this worker that it does not hold: the
        jobs of a claim that committed while its answer was lost. Return how many."""
        async with acquire(self.pool, "claim check") as conn:
            lost = await queries.owned_unheld(conn, self.cfg.worker_id, self.holdings.leases())
        adopted = 0
        for job in lost:
            if job.lease_id is None or self.holdings.get(job.lease_id) is not None:
                continue
            log.warning("claimer.adopted", extra={"job_id": str(job.id), "attempt": job.attempts})
            if adopted >= self._lost_booking:
                self.holdings.book(1)
            adopted += 1
            self.start_job(job)
        self.holdings.unbook(self._lost_booking - adopted)
        self._lost_booking = 0
        return adopted

    async def promote(self) -> int:
        """Move due scheduled jobs to queued and remember when the next one is due."""
        self._last_promote = self.clock.monotonic()
        async with acquire(self.pool, "promotion") as conn:
            result = await queries.promote_due(conn, now=self.clock.sql_now())
        if result.next_due_in_s is None:
            self._next_due = None
        else:
            # the delay comes from the database's clock: a daemon whose clock runs ahead
            # would otherwise see the job as due already and promote in a tight loop
            self._next_due = self.clock.monotonic() + max(result.next_due_in_s, 0.0)
        if result.promoted:
            log.info("claimer.promoted", extra={"count": result.promoted})
        return result.promoted

    def _promotion_due(self) -> bool:
        now = self.clock.monotonic()
        if now - self._last_promote >= self.cfg.poll_interval_s:
            return True
        return self._next_due is not None and now >= self._next_due

    def _sleep_s(self) -> float:
        sleep = jitter(self.cfg.poll_interval_s)
        if self._next_due is not None:
            sleep = min(sleep, max(self._next_due - self.clock.monotonic(), 0.0) + 0.005)
        return sleep
