"""Write outcomes in batches: one statement for every result that is ready.

Results queue up while a write is in flight and go out together in the next one, so
under load many jobs share a round trip and an idle daemon writes a lone result at
once. Every write is conditioned on the job's lease: a result whose lease is gone is
discarded, never applied, and the job's history gets an event saying so (from its
current status to the same, reason ``result discarded: lease lost``, this worker).
When the database is away, results are kept in memory and
written once it is back; the jobs stay held (and heartbeated) until then.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskStatus

from jobsd.errors import BackendUnavailable, DatabaseError, InvalidPayload
from jobsd.models import Job
from jobsd.store import queries
from jobsd.store.db import AsyncPool, acquire, cause_of
from jobsd.worker.clock import Clock
from jobsd.worker.executor import Outcome, failure
from jobsd.worker.faults import crash_at
from jobsd.worker.holdings import Held, Holdings
from jobsd.worker.loop import run_loop, through_outage
from jobsd.worker.mailbox import Mailbox
from jobsd.worker.outcome import error_record_of
from jobsd.worker.stats import DaemonStats
from jobsd.worker.waker import Waker

__all__ = ["Completer", "CompleterSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CompleterSettings:
    """Who writes (``worker_id``, named in the history of a discarded result) and how many
    outcomes one statement carries at most."""

    worker_id: str
    batch_size: int = 500
    linger_s: float = 0.002
    """how long a first outcome waits for those of the handlers still running"""
    fault: str | None = None
    """``JOBSD_FAULT``: ``after_outcome_sent`` exits before the outcome's commit"""


@dataclass(slots=True)
class _Result:
    held: Held
    outcome: Outcome
    progress: dict[str, Any] | None
    """the run's last progress, taken once: a retried write must carry it again"""
    tried: bool = False
    """a write of it was sent and its answer never came: it may be in the database"""


@dataclass(eq=False, repr=False)
class Completer:
    """Batch outcome writes and report failed jobs to ``on_failed``.

    A written retry (``scheduled``) or a freed concurrency key wakes the claimer.
    """

    pool: AsyncPool
    cfg: CompleterSettings
    clock: Clock
    holdings: Holdings
    stats: DaemonStats
    waker: Waker
    on_failed: Callable[[Job], None]
    on_recovery: Callable[[Job], None] | None = None
    _inbox: Mailbox[_Result] = field(default_factory=Mailbox, init=False)
    # one flush at a time: at shutdown drain() runs while run() may be mid-write, and
    # two writers of the same batch would report written results as discarded
    _flushing: anyio.Lock = field(default_factory=anyio.Lock, init=False)
    _settled_at: float = field(init=False)

    def __post_init__(self) -> None:
        self._settled_at = self.clock.monotonic()

    def submit(self, held: Held, outcome: Outcome) -> None:
        """Queue an outcome for writing; never blocks."""
        self._inbox.put(_Result(held, outcome, held.ctx.take_final()))

    @property
    def pending(self) -> int:
        """Return the number of outcomes not yet written."""
        return len(self._inbox)

    async def run_once(self) -> int:
        """Write up to one batch of pending outcomes; return how many were settled
        (written or discarded). A batch the database did not take stays pending."""
        async with self._flushing:
            batch = self._inbox.peek(self.cfg.batch_size)
            if batch:
                await self._write(batch)
                self._inbox.drop(len(batch))
            self._settled_at = self.clock.monotonic()
            return len(batch)

    def stalled(self, bound_s: float) -> bool:
        """Say whether outcomes have waited more than ``bound_s`` with no write settling
        any (the database away, or refusing): the watchdog then stops pinging."""
        return bool(self._inbox) and self.clock.monotonic() - self._settled_at > bound_s

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Write outcomes as they come, until cancelled; retry while the database is away."""
        await run_loop("finish", self.run_once, self._wait, self.clock, task_status=task_status)

    async def _wait(self) -> None:
        """Wait for an outcome; while handlers run or reserved jobs wait, linger a moment
        for the next ones (up to four turnovers of the slots), so that one write carries
        many (an idle daemon's outcome goes out at once)."""
        await self._inbox.wait()
        busy = self.holdings.running or self.holdings.waiting
        if busy and len(self._inbox) < 4 * self.holdings.slots:
            await anyio.sleep(self.cfg.linger_s)

    async def drain(self, timeout_s: float) -> None:
        """Write everything pending, giving up after ``timeout_s`` (at shutdown)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(timeout_s) as scope:
            while self._inbox:
                await through_outage("finish", self.run_once, self.clock)
        if scope.cancelled_caught and self._inbox:
            log.error(
                "completer.results_lost",
                extra={
                    "count": len(self._inbox),
                    "job_ids": [str(r.held.job.id) for r in self._inbox.peek(len(self._inbox))],
                },
            )

    async def _write(self, batch: list[_Result]) -> None:
        rows = [_finish_row(r) for r in batch]
        # after a write whose answer never came, the next one finds what it wrote
        confirm = any(r.tried for r in batch)
        try:
            async with acquire(self.pool, "finish") as conn:
                written = await queries.finish_batch(
                    conn, rows, before_commit=self._fault(batch), confirm=confirm
                )
        except BackendUnavailable:
            for result in batch:
                result.tried = True
            raise
        except (DatabaseError, InvalidPayload) as exc:
            # poison, not an outage (store.db.is_unavailable): the same rows would
            # fail the same way, so they are never retried as they are
            if len(batch) == 1:
                written = await self._write_poisoned(batch[0], exc)
            else:
                # One bad row must not hold back the others: write them one by one.
                for result in batch:
                    await self._write([result])
                return
        discarded = self._settle(batch, written)
        if discarded:
            await self._note_discarded(discarded)

    def _fault(self, batch: list[_Result]) -> Callable[[], object] | None:
        if self.cfg.fault != "after_outcome_sent":
            return None
        ids = [str(r.held.job.id) for r in batch]
        return lambda: crash_at("after_outcome_sent", ids)

    async def _note_discarded(self, job_ids: list[uuid.UUID]) -> None:
        # best effort: the result is discarded either way, only the evidence is lost
        try:
            async with acquire(self.pool, "note discarded") as conn:
                await queries.note_discarded(conn, job_ids, worker_id=self.cfg.worker_id)
        except (BackendUnavailable, DatabaseError) as exc:
            log.warning("completer.note_failed", extra={"count": len(job_ids), "error": str(exc)})

    async def _write_poisoned(
        self, result: _Result, exc: Exception
    ) -> dict[uuid.UUID, queries.Finished]:
        """Fail the job whose outcome the database refused, naming why; a job whose
        failure cannot be written either is left to the sweeper (logged, dropped)."""
        job_id = result.held.job.id
        log.error("completer.result_rejected", extra={"job_id": str(job_id)}, exc_info=True)
        replacement = failure(
            f"the job's result could not be stored: {cause_of(exc)}", reason="result rejected"
        )
        try:
            async with acquire(self.pool, "finish") as conn:
                # without the progress: it may be what the database refused
                return await queries.finish_batch(
                    conn, [_finish_row(_Result(result.held, replacement, None))]
                )
        except (DatabaseError, InvalidPayload) as again:
            if isinstance(again, BackendUnavailable):
                raise
            log.error(
                "completer.result_dropped",
                extra={"job_id": str(job_id), "error": cause_of(again)},
            )
            # not written: "discarded" below; the sweeper rescues the job once its
            # heartbeat is stale, as for any owner that stopped reporting
            return {}

    def _settle(
        self, batch: list[_Result], written: dict[uuid.UUID, queries.Finished]
    ) -> list[uuid.UUID]:
        """Account for a written batch; return the ids whose result was discarded."""
        discarded: list[uuid.UUID] = []
        for result in batch:
            job_id = result.held.job.id
            # a superseded run's lease is gone for good: its write cannot have matched,
            # even when the newer run of the same job in this batch was written
            job = None if result.held.superseded else written.get(job_id)
            self.holdings.forget(result.held)
            if job is None:
                self.stats.discarded += 1
                log.warning(
                    "job.result_discarded",
                    extra={
                        "job_id": str(job_id),
                        "reason": "lease lost",
                        "status": result.outcome.status,
                    },
                )
                discarded.append(job_id)
                continue
            self.stats.finished[(self.stats.label(job.type), str(job.status))] += 1
            self.stats.count_error(job.type, result.outcome)
            if log.isEnabledFor(logging.INFO):  # the record's fields cost even when dropped
                log.info(
                    "job.finished",
                    extra={
                        "job_id": str(job_id),
                        "type": job.type,
                        "status": str(job.status),
                        "duration_s": round(
                            self.clock.monotonic() - result.held.started_monotonic, 6
                        ),
                    },
                )
            if job.status == "failed":
                self.on_failed(job.applied_to(result.held.job, result.outcome.report_json))
            elif job.status == "recovery_required" and self.on_recovery is not None:
                # an ambiguous end: the type's recover hook decides (recoverer.py)
                self.on_recovery(job.applied_to(result.held.job, result.outcome.report_json))
            elif job.status == "scheduled":
                # a retry with a back-off: let the claimer learn its due time now
                self.waker.wake("scheduled")
            if job.concurrency_key is not None:
                # the next job of its key may be waiting for exactly this slot
                self.waker.wake("key")
        return discarded


def _finish_row(result: _Result) -> queries.FinishRow:
    outcome = result.outcome
    return queries.FinishRow(
        job_id=result.held.job.id,
        lease_id=result.held.lease_id,
        status=outcome.status,
        report_json=outcome.report_json,
        error=outcome.error,
        reason=outcome.reason,
        progress=result.progress,
        run_after=outcome.run_after,
        delay_s=outcome.delay_s,
        error_record=error_record_of(outcome),
    )
