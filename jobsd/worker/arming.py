"""Arm jobs claimed ahead: tell the database they may start, before they start.

A claim takes the jobs it claims ahead armed up to the armed target (a round of the
slots, or the jobs due to start within ``ARM_AHEAD_S``: ``Holdings.arm_room``); the
ones beyond it are marked ``claimed_ahead`` (migration 0021). A marked job has not
started, by construction: its handler starts only once the armer has cleared its mark.
So when a daemon dies holding jobs claimed ahead, the sweeper sends the marked ones
back to ``queued`` (reason ``not started``) instead of charging each a run it never
had, and a job still never runs more often than its type allows. When half the target
or less is left armed, the armer clears the marks of the next ones, up to the target,
in one statement (docs/decisions.md, "Claiming ahead").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from jobsd.errors import BackendUnavailable, DatabaseError
from jobsd.store import queries
from jobsd.store.db import AsyncPool, acquire, cause_of
from jobsd.worker.clock import Clock
from jobsd.worker.holdings import Held, Holdings
from jobsd.worker.loop import run_loop

__all__ = ["Armer"]

log = logging.getLogger(__name__)


@dataclass(eq=False, repr=False)
class Armer:
    """Clear the claimed-ahead marks of the next jobs to start, a batch at a time."""

    pool: AsyncPool
    clock: Clock
    holdings: Holdings
    on_armed: Callable[[], None]
    """start what may start now (the runner's ``start_waiting``)"""
    _taken: list[Held] = field(default_factory=list, init=False)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Arm until cancelled."""
        await run_loop(
            "arming", self.run_once, self.holdings.wait_to_arm, self.clock, task_status=task_status
        )

    async def run_once(self) -> int:
        """Arm the jobs due; return how many. While the database is away the same jobs
        are tried again; jobs it refuses to arm are given up as lost (they never start:
        the sweeper sends them back to ``queued`` unstarted)."""
        taken = self._taken = self._taken or self.holdings.to_arm()
        if not taken:
            return 0
        try:
            async with acquire(self.pool, "arming") as conn:
                alive = await queries.arm_claimed_ahead(
                    conn, [(h.job.id, h.lease_id) for h in taken]
                )
        except BackendUnavailable:
            raise
        except DatabaseError as exc:
            log.error("runner.arming_rejected", extra={"count": len(taken), "error": cause_of(exc)})
            alive = set()
        self._taken = []
        self.holdings.arm(taken, alive)
        self.on_armed()
        return len(taken)
