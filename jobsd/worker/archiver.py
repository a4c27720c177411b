"""Move ended jobs out of the hot table, into the archive, in batches.

The hot table (``jobsd.jobs``) holds the open jobs and the ones that ended less than
``archive_after`` ago; every pass (every ``interval``, jittered) moves the older ended
jobs, with their history, into ``jobsd.jobs_archive`` and ``jobsd.job_events_archive``
(monthly partitions of the end time): one statement per batch of ``batch`` jobs,
oldest end first, as many batches as there are full ones, each its own transaction.
Rows another session holds (an enqueue holding a given id, a prune) are skipped and
moved by a later pass; several daemons may move at once.

The archive's months are made as a batch needs them, and ahead: the month in progress
and the next ``months_ahead`` exist after each daemon's first pass, checked again
every hour, so that no month is ever created under load by surprise.

A batch the database refuses (a month that cannot be made: no space, a table in the
way, a missing privilege) moves nothing and loses nothing: the jobs stay in the hot
table, where every read finds them. The refusal is logged (``archive.refused``) and
counted, and the pass is tried again at the next interval; the daemon goes on. A
batch that does not finish within the statement timeout (a loaded server) is rolled
back like any other: the next ones are half as big (down to 100 jobs), and grow back
after each full batch that goes through.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from jobsd.errors import BackendUnavailable, DatabaseError
from jobsd.store import archive
from jobsd.store.db import AsyncPool, acquire, cause_of
from jobsd.worker.clock import Clock
from jobsd.worker.loop import pause, run_loop
from jobsd.worker.stats import DaemonStats

__all__ = ["Archiver", "ArchiverSettings"]

log = logging.getLogger(__name__)

# how often the months ahead are checked
_MONTHS_CHECK_S = 3600.0
# batches in one pass at most, so that a backlog (an upgraded database) is moved in
# passes that each end, instead of one pass that never does
_MAX_BATCHES_PER_PASS = 200
# the smallest batch a slow server brings the move down to
_MIN_BATCH = 100


@dataclass(frozen=True, slots=True)
class ArchiverSettings:
    """How long ended jobs stay hot, how often and how many move at once."""

    archive_after_s: float
    interval_s: float
    batch: int
    months_ahead: int = 2


@dataclass(eq=False, repr=False)
class Archiver:
    """Move ended jobs into the archive; make its months ahead."""

    pool: AsyncPool
    cfg: ArchiverSettings
    clock: Clock
    stats: DaemonStats
    _months_checked_at: float | None = field(default=None, init=False)
    _batch: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._batch = self.cfg.batch

    @property
    def batch(self) -> int:
        """Return the jobs moved per statement now (smaller after a batch timed out)."""
        return self._batch

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Move every interval until cancelled."""
        await run_loop(
            "archive",
            self.run_once,
            pause(self.cfg.interval_s, self.clock),
            self.clock,
            task_status=task_status,
        )

    async def run_once(self) -> int:
        """Do one pass; return how many jobs moved. A refused batch is logged, not raised."""
        moved = 0
        try:
            now = self.clock.monotonic()
            if self._months_checked_at is None or now - self._months_checked_at > (_MONTHS_CHECK_S):
                async with acquire(self.pool, "archive months") as conn:
                    created = await archive.ensure_ahead(conn, months=self.cfg.months_ahead)
                self._months_checked_at = now
                if created:
                    log.info("archive.months_created", extra={"months": created})
            for _ in range(_MAX_BATCHES_PER_PASS):
                size = self._batch
                try:
                    # a connection per batch: the pool's deadline bounds one statement,
                    # and other services get their turn between batches
                    async with acquire(self.pool, "archive") as conn:
                        count = await archive.move_batch(
                            conn, limit=size, min_age_s=self.cfg.archive_after_s
                        )
                except BackendUnavailable:
                    # away, or too slow for the statement timeout: smaller next time
                    self._batch = max(_MIN_BATCH, size // 2)
                    if self._batch < size:
                        log.warning("archive.batch_reduced", extra={"batch": self._batch})
                    raise
                moved += count
                if count < size:
                    break
                self._batch = min(self.cfg.batch, size * 2)
        except BackendUnavailable:
            # the database is away: the outage policy of every service (run_loop)
            self.stats.archived += moved
            raise
        except DatabaseError as exc:
            self.stats.archive_refused += 1
            log.error(
                "archive.refused",
                extra={"cause": cause_of(exc), "moved_before": moved, "error": str(exc)},
            )
        self.stats.archived += moved
        if moved:
            log.debug("archive.moved", extra={"jobs": moved})
        return moved
