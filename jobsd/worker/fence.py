"""Stop this daemon's runs before its lease ends, when the lease cannot be renewed.

Another daemon may declare this one dead, and run its jobs again, once two things hold
(``lifeline.py``, ``workers_take_dead``): its lock is free and its lease (``alive_until``
in ``jobsd.workers``) has run out on the database's clock. The lifeline renews the lease
every few seconds; a renewal sent at ``t`` (this daemon's monotonic clock) sets
``alive_until`` to the database's ``now()`` when it runs, plus ``lease_s``: at least
``t + lease_s`` in the database's time. So as long as nothing of this daemon's runs
past ``t + lease_s``, no rescue can overlap one of its runs.

The fence keeps that promise when renewals stop getting through (the database away,
the lock's connection lost and not taken again). ``close_after_s`` after the last
renewal sent it closes: no claim, no start, and every run is stopped (its handler
cancelled, its job written back as the daemon's stop would). At ``deadline_s`` after it,
if a handler still runs (a sync handler's thread ignoring ``ctx.cancelled``), the daemon
cannot stop it and must not outlive its lease with it: ``on_breach`` (by default, the
process exits at once, so the thread goes with it; systemd starts a fresh one). A
renewal that gets through opens the fence again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from jobsd.worker.clock import Clock

__all__ = ["BREACH_EXIT_STATUS", "Fence", "FenceSettings", "exit_now"]

log = logging.getLogger(__name__)

BREACH_EXIT_STATUS = 75
"""the daemon's exit status when a handler outlives the lease (EX_TEMPFAIL: restart me)"""


def exit_now() -> None:
    """Exit the process at once: a handler's thread that ignores cancellation dies with it."""
    logging.shutdown()
    os._exit(BREACH_EXIT_STATUS)


@dataclass(frozen=True, slots=True)
class FenceSettings:
    """The lease, and when the fence closes and breaks within it."""

    lease_s: float
    """``JOBSD_WORKER_LEASE``"""

    @property
    def close_after_s(self) -> float:
        """Return how long after the last renewal sent the runs are stopped: two thirds
        of the lease (the last third is theirs to stop in)."""
        return self.lease_s * 2 / 3

    @property
    def deadline_s(self) -> float:
        """Return how long after the last renewal sent nothing may still run: the lease,
        less a tenth of it (at most 1 s) for the exit itself."""
        return self.lease_s - min(self.lease_s / 10, 1.0)


@dataclass(eq=False, repr=False)
class Fence:
    """Open while this daemon's lease is surely alive; closed (runs stopped) otherwise."""

    cfg: FenceSettings
    clock: Clock
    stop_runs: Callable[[], None]
    """cancel every run and give back every reservation (the runner's ``fence``)"""
    still_running: Callable[[], bool]
    """whether any handler of this daemon still runs"""
    on_breach: Callable[[], None] = exit_now
    on_open: Callable[[], None] | None = None
    """told when the fence opens again (the runner's ``unfence``)"""
    _renewed_at: float = field(default=-float("inf"), init=False)
    _open: bool = field(default=False, init=False)
    _opened: anyio.Event = field(default_factory=anyio.Event, init=False)
    _changed: anyio.Event = field(default_factory=anyio.Event, init=False)
    closings: int = field(default=0, init=False)
    """how many times the fence closed (for tests and logs)"""

    @property
    def open(self) -> bool:
        """Say whether the daemon may claim and start jobs."""
        return self._open

    def renewed(self, sent_at: float) -> None:
        """Record a renewal (or registration) that got through, sent at ``sent_at``."""
        if sent_at <= self._renewed_at:
            return
        self._renewed_at = sent_at
        if not self._open and self.clock.monotonic() < sent_at + self.cfg.close_after_s:
            self._open = True
            self._opened.set()
            if self.on_open is not None:
                self.on_open()
            if self.closings:
                log.warning("worker.fence_opened", extra={"lease_s": self.cfg.lease_s})
        self._changed.set()

    async def wait_open(self) -> None:
        """Wait until the fence is open."""
        while not self._open:
            await self._opened.wait()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Close the fence when the lease is about to end unrenewed; until cancelled."""
        task_status.started()
        while True:
            self._changed = anyio.Event()
            if not self._open:
                await self._changed.wait()
                continue
            close_at = self._renewed_at + self.cfg.close_after_s
            with anyio.move_on_after(max(close_at - self.clock.monotonic(), 0.0)):
                await self._changed.wait()
                continue
            if self.clock.monotonic() >= self._renewed_at + self.cfg.close_after_s:
                await self._close()

    async def _close(self) -> None:
        renewed_at = self._renewed_at
        self._open = False
        self._opened = anyio.Event()
        self.closings += 1
        log.error(
            "worker.fenced",
            extra={
                "lease_s": self.cfg.lease_s,
                "since_renewal_s": round(self.clock.monotonic() - renewed_at, 3),
            },
        )
        self.stop_runs()
        deadline = renewed_at + self.cfg.deadline_s
        while self.still_running() and not self._open:
            if self.clock.monotonic() >= deadline:
                log.critical(
                    "worker.fence_breached",
                    extra={"lease_s": self.cfg.lease_s, "action": "exit"},
                )
                self.on_breach()
                return
            await self.clock.sleep(min(0.05, max(deadline - self.clock.monotonic(), 0.0)))
