"""The jobs this daemon holds: running, or finished with the outcome not yet written."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import anyio

from jobsd.context import JobContext
from jobsd.models import Job
from jobsd.worker.clock import SYSTEM_CLOCK, Clock

__all__ = ["Held", "Holdings"]


@dataclass(slots=True)
class Held:
    """One job held under a lease."""

    job: Job
    lease_id: uuid.UUID
    ctx: JobContext
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    finished: bool = False
    lost: bool = False
    cancel_requested: bool = False
    """a cancel request reached this run: its handler is cancelled, the job written cancelled"""
    superseded: bool = False
    """this daemon claimed the job again under a new lease: this run can no longer report"""
    started_monotonic: float = 0.0
    """when the run started, on the daemon's clock"""


class Holdings:
    """Held jobs and the slot count; the claimer never takes more than the free slots.

    A slot frees when the handler returns, before its outcome is written: writing is
    the completer's business, and the job stays held (and heartbeated) until then.

    Holdings are keyed by lease, not by job: a job swept away from this daemon can be
    claimed again by it while the old run still ends, and the two must not be mixed up.
    """

    def __init__(self, slots: int, clock: Clock = SYSTEM_CLOCK) -> None:
        self.slots = slots
        self.clock = clock
        self._held: dict[uuid.UUID, Held] = {}  # by lease id
        self._running = 0
        self._changed = anyio.Event()

    @property
    def free(self) -> int:
        """Return the number of free slots."""
        return self.slots - self._running

    @property
    def running(self) -> int:
        """Return the number of handlers running."""
        return self._running

    def add(self, job: Job, ctx: JobContext) -> Held:
        """Hold a freshly claimed job and take a slot.

        An earlier run of the same job still held here has lost its lease by definition
        (the claim issued a new one): it is marked lost and its handler is cancelled.
        """
        assert job.lease_id is not None
        for earlier in self._held.values():
            if earlier.job.id == job.id:
                earlier.superseded = True
                self.mark_lost(earlier)
        held = Held(
            job=job, lease_id=job.lease_id, ctx=ctx, started_monotonic=self.clock.monotonic()
        )
        self._held[held.lease_id] = held
        self._running += 1
        return held

    def mark_lost(self, held: Held) -> bool:
        """Record that a run lost its lease and cancel its handler; False if already known."""
        if held.lost:
            return False
        held.lost = True
        held.ctx.mark_cancelled()
        if not held.finished:
            held.scope.cancel()
        return True

    def request_cancel(self, held: Held) -> bool:
        """Cancel a run's handler on request; False if already known or finished."""
        if held.cancel_requested or held.lost or held.finished:
            return False
        held.cancel_requested = True
        held.ctx.mark_cancelled()
        held.scope.cancel()
        return True

    def release_slot(self, held: Held) -> None:
        """Free the slot of a job whose handler has returned."""
        if not held.finished:
            held.finished = True
            self._running -= 1
            self._signal()

    def forget(self, held: Held) -> None:
        """Stop holding a run whose outcome is written or discarded."""
        self._held.pop(held.lease_id, None)
        self._signal()

    def get(self, lease_id: uuid.UUID) -> Held | None:
        """Return the run held under a lease, or None."""
        return self._held.get(lease_id)

    def __iter__(self) -> Iterator[Held]:
        return iter(list(self._held.values()))

    def __len__(self) -> int:
        return len(self._held)

    async def wait_free(self) -> None:
        """Wait until at least one slot is free."""
        while self.free <= 0:
            await self._wait_change()

    async def wait_idle(self) -> None:
        """Wait until no handler runs."""
        while self._running > 0:
            await self._wait_change()

    async def wait_empty(self) -> None:
        """Wait until nothing is held (every outcome written or discarded)."""
        while self._held:
            await self._wait_change()

    async def _wait_change(self) -> None:
        await self._changed.wait()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
