"""Write heartbeats and progress for every held job, one statement per tick.

Each tick (``progress_interval``) writes the jobs whose handlers reported progress;
every ``heartbeat_interval`` (at most a third of ``stale_after``) it writes all held
jobs, which stamps ``progress.updated_at``: the sweeper's proof of life. A job missing
from the result lost its lease (swept or claimed elsewhere): its handler is cancelled
and its outcome will be discarded. A job returned with a cancel request has its handler
cancelled (``ctx.cancelled`` for sync handlers) and is then written ``cancelled``.
"""

from __future__ import annotations

import logging
import time

import anyio

from jobsd.errors import BackendUnavailable
from jobsd.settings import Settings
from jobsd.store import queries
from jobsd.store.db import AsyncPool, acquire
from jobsd.worker.holdings import Holdings

__all__ = ["Heartbeat"]

log = logging.getLogger(__name__)


class Heartbeat:
    """Keep held jobs alive in the database and flush their progress."""

    def __init__(self, pool: AsyncPool, holdings: Holdings, settings: Settings) -> None:
        self.pool = pool
        self.holdings = holdings
        self.tick_s = min(settings.progress_interval, settings.effective_heartbeat_s)
        self.beat_s = settings.effective_heartbeat_s
        self._last_beat = time.monotonic()

    async def run(self) -> None:
        """Tick until cancelled; a database outage only delays the next write."""
        while True:
            await anyio.sleep(self.tick_s)
            try:
                await self.run_once()
            except BackendUnavailable as exc:
                log.warning("heartbeat.failed", extra={"error": str(exc)})

    async def run_once(self, *, force: bool = False) -> int:
        """Write one tick; return how many jobs were written."""
        now = time.monotonic()
        beat = force or now - self._last_beat >= self.beat_s
        rows, taken, sent = [], [], []
        for held in self.holdings:
            if held.lost:
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
            async with acquire(self.pool, "heartbeat") as conn:
                alive = await queries.heartbeat_v2(conn, rows)
        except BackendUnavailable:
            for held, fields in taken:
                held.ctx.restore_pending(fields)
            raise
        for held, _ in taken:
            held.ctx.pending_written()
        if beat:
            self._last_beat = now
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
