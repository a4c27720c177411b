"""Write the progress of held jobs and check that each is still this daemon's, one
statement per tick.

Each tick (``progress_interval``) writes the jobs whose handlers reported progress
(which stamps ``progress.updated_at``: the handler's last sign of life, never the
daemon's, whose liveness is its lease: ``lifeline.py``); every ``heartbeat_interval``
it also checks, without writing them, every other held job. A job missing from the
result lost its lease (swept or claimed elsewhere): its handler is cancelled and its
outcome will be discarded. A job returned with a cancel request has its handler
cancelled (``ctx.cancelled`` for sync handlers) and is then written ``cancelled``.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from jobsd.errors import BackendUnavailable, DatabaseError, InvalidPayload
from jobsd.store import queries
from jobsd.store.db import AsyncPool, acquire, cause_of
from jobsd.worker.clock import Clock
from jobsd.worker.holdings import Holdings
from jobsd.worker.loop import pause, run_loop

__all__ = ["Heartbeat", "HeartbeatSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HeartbeatSettings:
    """How often to write progress (``tick_s``) and to check every held job (``beat_s``)."""

    tick_s: float
    """``min(JOBSD_PROGRESS_INTERVAL, beat_s)``"""
    beat_s: float
    """``JOBSD_HEARTBEAT_INTERVAL``, at most a third of ``JOBSD_STALE_AFTER``"""


@dataclass(eq=False, repr=False)
class Heartbeat:
    """Flush held jobs' progress and notice lost leases and cancel requests."""

    pool: AsyncPool
    cfg: HeartbeatSettings
    clock: Clock
    holdings: Holdings
    _last_beat: float = field(init=False)
    beats: int = field(default=0, init=False)
    """beats that got through (every held job checked)"""

    def __post_init__(self) -> None:
        self._last_beat = self.clock.monotonic()

    def stalled(self, bound_s: float) -> bool:
        """Say whether no beat has got through for more than ``bound_s``, or three beat
        periods when longer (the database away): the watchdog then stops pinging, as
        cancel requests and lost leases go unnoticed."""
        bound = max(bound_s, 3 * self.cfg.beat_s)
        return self.clock.monotonic() - self._last_beat > bound

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Tick every ``tick_s`` (jittered) until cancelled."""
        await run_loop(
            "heartbeat",
            self.run_once,
            pause(self.cfg.tick_s, self.clock),
            self.clock,
            task_status=task_status,
        )

    async def run_once(self, *, force: bool = False) -> int:
        """Write one tick: the pending progress, and on a beat every held job; return
        how many jobs were written. Progress taken for a write that failed is put back."""
        now = self.clock.monotonic()
        beat = force or now - self._last_beat >= self.cfg.beat_s
        rows, taken, sent = [], [], []
        for held in self.holdings:
            if held.lost or held.reserved:  # a reserved job is queued: nothing runs
                continue
            fields = held.ctx.take_pending()
            if fields is not None:
                taken.append((held, fields))
            if beat or fields is not None:
                rows.append(queries.HeartbeatRow(held.job.id, held.lease_id, fields))
                sent.append(held)
        if not rows:
            if beat:
                self._last_beat = now
            return 0
        try:
            alive = await self._write(rows)
        except BackendUnavailable:
            for held, fields in taken:
                held.ctx.restore_pending(fields)
            raise
        for held, _ in taken:
            held.ctx.pending_written()
        if beat:
            self._last_beat = now
            self.beats += 1
        # A job is held under one lease at a time (Holdings.add), so its id names the
        # run. A finished run may be missing because its own outcome was just written:
        # only a run still in its handler is known to have lost its lease.
        for held in sent:
            if held.job.id in alive:
                if alive[held.job.id] and self.holdings.request_cancel(held):
                    log.info("job.cancel_requested", extra={"job_id": str(held.job.id)})
                continue
            if held.finished:
                continue
            if self.holdings.mark_lost(held):
                log.warning("job.lease_lost", extra={"job_id": str(held.job.id)})
        return len(rows)

    async def _write(self, rows: list[queries.HeartbeatRow]) -> dict[uuid.UUID, bool]:
        """Write the rows; when the database refuses them (poison, not an outage: a
        progress over its size cap, say), write them one by one, and a row refused on
        its own again without its progress, which is dropped and logged."""
        try:
            async with acquire(self.pool, "heartbeat") as conn:
                return await queries.heartbeat_v2(conn, rows)
        except BackendUnavailable:
            raise
        except (DatabaseError, InvalidPayload) as exc:
            if len(rows) > 1:
                alive: dict[uuid.UUID, bool] = {}
                for row in rows:
                    alive.update(await self._write([row]))
                return alive
            row = rows[0]
            if row.fields is None:
                # a plain beat refused: keep the job (a lost lease shows at a later beat)
                log.error("heartbeat.rejected", extra={"job_id": str(row.job_id)}, exc_info=True)
                return {row.job_id: False}
            log.error(
                "job.progress_rejected",
                extra={"job_id": str(row.job_id), "error": cause_of(exc)},
            )
            return await self._write([queries.HeartbeatRow(row.job_id, row.lease_id, None)])
