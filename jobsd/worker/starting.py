"""Start reserved jobs when slots free, and give back the reservations not started.

A claim starts at once only as many jobs as its daemon has free slots; the rest it
reserves (``queued``, under the daemon's lease, until ``reserved_until``). A reserved
job has not started and has been charged nothing. When slots free, the starter moves
the oldest reserved jobs, one per free slot, to ``running`` in one statement (their
attempt counted then, each under a fresh lease), and only then do their handlers
start. So ``running`` rows are handlers started, and a job whose daemon dies while it
waits is simply claimable again once its reservation ends: no sweep, no charge.

A start whose answer never came (the connection broke) is tried again with the same
leases and ``confirm``: the jobs the first try started come back with the others, so
none is left running without a handler. Reservations given back (the stop, or no slot
freed in time) are released in one statement; if that fails they end on their own.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from jobsd.errors import BackendUnavailable, DatabaseError
from jobsd.store import queries
from jobsd.store.db import AsyncPool, acquire, cause_of
from jobsd.worker.clock import Clock
from jobsd.worker.holdings import Held, Holdings
from jobsd.worker.loop import run_loop

__all__ = ["Starter", "StarterSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StarterSettings:
    """Whether starts wait for the disk at commit (``JOBSD_DURABLE_CLAIMS``)."""

    durable: bool = False


@dataclass(eq=False, repr=False)
class Starter:
    """Start reserved jobs a batch of free slots at a time; release the given back."""

    pool: AsyncPool
    cfg: StarterSettings
    clock: Clock
    holdings: Holdings
    run_started: Callable[[Held], None]
    """run a job just started (the runner's ``start_reserved``)"""
    _taken: list[Held] = field(default_factory=list, init=False)
    """the jobs of a start whose answer never came: tried again, with ``confirm``"""
    _to_release: list[Held] = field(default_factory=list, init=False)
    _release_due: anyio.Event = field(default_factory=anyio.Event, init=False)
    _released: anyio.Event = field(default_factory=anyio.Event, init=False)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start and release until cancelled."""
        async with anyio.create_task_group() as tg:
            await tg.start(self._run_releases)
            await run_loop(
                "start",
                self.run_once,
                self._wait_startable,
                self.clock,
                task_status=task_status,
            )

    async def _wait_startable(self) -> None:
        while not (self._taken or self.holdings.startable):
            await self.holdings.wait_changed()

    def settle(self, taken: list[Held], started: Mapping[uuid.UUID, queries.Started]) -> None:
        """Run the jobs started, let go the others (their reservation was gone)."""
        for held in taken:
            start = started.get(held.job.id)
            if start is None:
                self.holdings.not_started(held)
                continue
            self.holdings.started(held, start.attempts, start.started_at)
            self.run_started(held)

    async def run_once(self) -> int:
        """Start the reserved jobs that have a free slot; return how many were tried."""
        confirm = bool(self._taken)
        taken = self._taken = self._taken or self.holdings.take_startable()
        if not taken:
            return 0
        runs = []
        for held in taken:
            assert held.start_lease_id is not None
            runs.append((held.job.id, held.lease_id, held.start_lease_id))
        try:
            async with acquire(self.pool, "start") as conn:
                started = await queries.start_reserved(
                    conn, runs, durable=self.cfg.durable, confirm=confirm
                )
        except BackendUnavailable:
            raise  # tried again (with confirm) once the database answers
        except DatabaseError as exc:
            # refused whole: nothing started; the reservations end on their own
            log.error("runner.start_rejected", extra={"count": len(taken), "error": cause_of(exc)})
            started = {}
        self._taken = []
        self.settle(taken, started)
        return len(taken)

    def release(self, held: list[Held]) -> None:
        """Give back reservations not started (released in the background)."""
        self._to_release.extend(held)
        self._release_due.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` until the reservations given back are released."""
        with anyio.move_on_after(timeout_s):
            while self._to_release:
                released = self._released
                await released.wait()

    async def _run_releases(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        await run_loop(
            "release",
            self._release_once,
            self._wait_release,
            self.clock,
            task_status=task_status,
        )

    async def _wait_release(self) -> None:
        if not self._to_release:
            self._release_due = anyio.Event()
            await self._release_due.wait()

    async def _release_once(self) -> int:
        batch = list(self._to_release)
        if not batch:
            return 0
        reservations: list[tuple[uuid.UUID, uuid.UUID]] = [(h.job.id, h.lease_id) for h in batch]
        try:
            async with acquire(self.pool, "release") as conn:
                released = await queries.release_reserved(conn, reservations)
        except BackendUnavailable:
            raise
        except DatabaseError as exc:
            log.error(
                "runner.release_rejected", extra={"count": len(batch), "error": cause_of(exc)}
            )
            released = set()
        del self._to_release[: len(batch)]
        if not self._to_release:
            self._released.set()
            self._released = anyio.Event()
        log.debug("runner.released", extra={"count": len(released), "given": len(batch)})
        return len(batch)
