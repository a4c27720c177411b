"""The jobs this daemon holds: reserved ahead of its slots, running, or finished with the
outcome not yet written."""

from __future__ import annotations

import enum
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

import anyio

from jobsd.context import JobContext
from jobsd.models import Job
from jobsd.worker.clock import SYSTEM_CLOCK, Clock

__all__ = [
    "AHEAD_EXPECTED_WAIT_SHARE",
    "AHEAD_MAX_WAIT_S",
    "Held",
    "Holdings",
    "RunPhase",
    "RunStop",
]

AHEAD_MAX_WAIT_S = 1.0
"""the default of ``JOBSD_CLAIM_AHEAD_MAX_WAIT`` (Settings.claim_ahead_max_wait): how
long a job claimed ahead may wait while no slot frees before it is given back (and how
short runs must be for claiming ahead to go on)"""

AHEAD_EXPECTED_WAIT_SHARE = 0.1
"""the jobs claimed ahead are as many as the slots start, at the mean run time, within
this share of ``ahead_max_wait_s`` (at most ``ahead``)"""

# weight of the newest run in the running mean of run times
_RUN_S_WEIGHT = 0.2


class RunPhase(enum.Enum):
    """Where a held run is in its life; it only moves forward."""

    RESERVED = "reserved"
    """queued in the database under this daemon's reservation: no slot, no handler"""
    STARTING = "starting"
    """a slot taken, its start (queued -> running, under ``start_lease_id``) in flight"""
    RUNNING = "running"
    """running in the database, a slot taken: its handler runs (or is about to)"""
    ENDED = "ended"
    """its handler returned, or it never started: no slot; its outcome is on its way"""


class RunStop(enum.IntEnum):
    """Why a run was stopped from outside its handler. A stronger cause replaces a
    weaker one (``Held.stop_for``): a lost lease makes any outcome moot, the daemon's
    fence or stop writes the job back, a cancel request cancels it."""

    NONE = 0
    CANCEL_REQUESTED = 1
    """a cancel request reached the run: its handler is cancelled, the job written cancelled"""
    SHUTDOWN = 2
    """the daemon's stop cancelled it past its grace time: the job is written back"""
    FENCED = 3
    """the daemon's lease may run out (``fence.py``): the job is written back"""
    LEASE_LOST = 4
    """its lease is gone (swept, cancelled, claimed elsewhere): its outcome is discarded"""
    SUPERSEDED = 5
    """this daemon claimed the job again under a new lease: this run can never report"""


@dataclass(slots=True)
class Held:
    """One job held under a lease: its run's phase and, if it was stopped, why."""

    job: Job
    lease_id: uuid.UUID
    ctx: JobContext
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    phase: RunPhase = RunPhase.RUNNING
    stop: RunStop = RunStop.NONE
    started_monotonic: float = 0.0
    """when the run started, on the daemon's clock"""
    start_lease_id: uuid.UUID | None = None
    """the lease its start writes, while that start is in flight (``STARTING``)"""

    def stop_for(self, why: RunStop) -> bool:
        """Record why the run is stopped, unless a cause as strong is known; say whether
        it was recorded."""
        if why <= self.stop:
            return False
        self.stop = why
        return True

    @property
    def finished(self) -> bool:
        """Say whether the run has ended (no handler runs, no slot is held)."""
        return self.phase is RunPhase.ENDED

    @property
    def reserved(self) -> bool:
        """Say whether the job is still queued in the database (its handler not started)."""
        return self.phase in (RunPhase.RESERVED, RunPhase.STARTING)

    @property
    def lost(self) -> bool:
        """Say whether the run's lease is gone."""
        return self.stop >= RunStop.LEASE_LOST

    @property
    def superseded(self) -> bool:
        return self.stop is RunStop.SUPERSEDED

    @property
    def interrupted(self) -> bool:
        """Say whether the daemon's stop or fence stopped the run (it is written back)."""
        return self.stop in (RunStop.SHUTDOWN, RunStop.FENCED)

    @property
    def fenced(self) -> bool:
        return self.stop is RunStop.FENCED

    @property
    def cancel_requested(self) -> bool:
        return self.stop is RunStop.CANCEL_REQUESTED


class Holdings:
    """Held jobs and the slot count; the claimer never takes more than the free slots.

    A slot frees when the handler returns, before its outcome is written: writing is
    the completer's business, and the job stays held (and heartbeated) until then.

    Holdings are keyed by lease, not by job: a job swept away from this daemon can be
    claimed again by it while the old run still ends, and the two must not be mixed up.

    Claiming ahead pays while the slots turn over. Before any run has ended, at most a
    round of the slots is claimed ahead; then as many as the slots start within a tenth
    of ``ahead_max_wait_s`` at the mean run time (at most ``ahead``: no-op jobs claim
    ``ahead``, runs of a tenth of the wait one per slot). It stops while runs take more
    than half of ``ahead_max_wait_s`` on average, or while no slot has freed for that
    half (every slot is held by a run that lasts); and jobs claimed ahead that waited
    ``ahead_max_wait_s`` with no slot freeing meanwhile are stale (``stale_in``): the
    runner gives them back for another daemon (docs/decisions.md, "Claiming ahead").
    """

    def __init__(
        self,
        slots: int,
        clock: Clock = SYSTEM_CLOCK,
        *,
        ahead: int = 0,
        ahead_max_wait_s: float = AHEAD_MAX_WAIT_S,
    ) -> None:
        self.slots = slots
        self.ahead = ahead
        """jobs claimed ahead of the free slots: held (and heartbeated), not started yet"""
        self.ahead_max_wait_s = ahead_max_wait_s
        self.clock = clock
        self._last_freed = clock.monotonic()
        """when a slot last freed (or these holdings began)"""
        self._mean_run_s: float | None = None
        """running mean of this daemon's run times (None: no run has ended yet)"""
        self._on_waiting: anyio.Event | None = None
        self._waiting: deque[Held] = deque()
        """jobs reserved ahead of the slots, oldest first: each starts when a slot frees"""
        self._held: dict[uuid.UUID, Held] = {}  # by lease id
        self._runs: dict[uuid.UUID, list[Held]] = {}  # by job id: a claim finds earlier runs
        self._running = 0
        self._changed = anyio.Event()
        self._watched = False  # someone waits on _changed: a change must set it

    @property
    def free(self) -> int:
        """Return the number of free slots."""
        return self.slots - self._running

    @property
    def claimable(self) -> int:
        """Return how many jobs the claimer may claim now: free slots, plus the room
        left for jobs claimed ahead (none while the slots do not turn over)."""
        return self.slots + self.ahead_now - self._running - self.waiting

    @property
    def ahead_now(self) -> int:
        """Return how many jobs may be claimed ahead now: as many as the slots start
        within a tenth of the wait while slots free (at most ``ahead``), else 0 (a job
        claimed ahead would wait for a slot that lasts)."""
        if not self.ahead:
            return 0
        half = self.ahead_max_wait_s / 2
        if self.free <= 0 and self.clock.monotonic() - self._last_freed > half:
            return 0
        mean = self._mean_run_s
        if mean is None:
            return min(self.ahead, self.slots)  # no run has ended: one round's worth
        if mean > half:
            return 0
        budget = self.slots * self.ahead_max_wait_s * AHEAD_EXPECTED_WAIT_SHARE
        if mean * self.ahead <= budget:
            return self.ahead
        return int(budget / mean)

    def stale_in(self) -> float | None:
        """Return the seconds until the jobs claimed ahead are stale (0: they are): no
        slot freed for ``ahead_max_wait_s``, and the oldest waited that long; None when
        none waits."""
        if not self._waiting:
            return None
        oldest = self._waiting[0].started_monotonic
        since = max(self._last_freed, oldest)
        return max(since + self.ahead_max_wait_s - self.clock.monotonic(), 0.0)

    @property
    def waiting(self) -> int:
        """Return the number of jobs reserved ahead of the slots and not started yet."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Return the number of handlers running."""
        return self._running

    def book(self, slots: int) -> int:
        """Take ``slots`` slots for jobs about to be added with ``booked`` (a claim's
        free slots, while it is in flight); return it. ``unbook`` returns the unused."""
        self._running += slots
        return slots

    def unbook(self, slots: int) -> None:
        """Return booked slots that no job took."""
        if slots > 0:
            self._running -= slots
            self._signal()

    def add(self, job: Job, ctx: JobContext, *, booked: bool = False) -> Held:
        """Hold a job that is running in the database and take a slot (``booked``: one
        taken by ``book``).

        An earlier run of the same job still held here has lost its lease by definition
        (the claim issued a new one): it is marked lost and its handler is cancelled.
        """
        assert job.lease_id is not None
        runs = self._runs.setdefault(job.id, [])
        for earlier in runs:
            self.mark_lost(earlier, RunStop.SUPERSEDED)
        held = Held(
            job=job, lease_id=job.lease_id, ctx=ctx, started_monotonic=self.clock.monotonic()
        )
        self._held[held.lease_id] = held
        runs.append(held)
        if not booked:
            self._running += 1
        return held

    def add_waiting(self, job: Job, ctx: JobContext) -> Held:
        """Hold a job reserved ahead of the free slots (queued in the database);
        ``take_startable`` hands it to the starter when a slot frees."""
        held = self.add(job, ctx, booked=True)
        held.phase = RunPhase.RESERVED
        self._waiting.append(held)
        if self._on_waiting is not None:
            self._on_waiting.set()
            self._on_waiting = None
        self._signal()
        return held

    def take_startable(self) -> list[Held]:
        """Take a slot for each of the oldest reserved jobs, as many as slots are free,
        and return them (each gets the lease its start will write): the starter starts
        them in the database before their handlers start. A reservation lost meanwhile
        is let go."""
        taken: list[Held] = []
        now = self.clock.monotonic()
        while self._waiting and self.free > 0:
            held = self._waiting.popleft()
            if held.lost:
                held.phase = RunPhase.ENDED
                self.forget(held)
                continue
            held.started_monotonic = now
            held.start_lease_id = uuid.uuid4()
            held.phase = RunPhase.STARTING
            self._running += 1
            taken.append(held)
        return taken

    def started(self, held: Held, attempts: int, started_at: datetime) -> None:
        """Record that a reserved job has started (running, under ``start_lease_id``, at
        attempt ``attempts``): its handler may start now."""
        lease_id = held.start_lease_id
        assert lease_id is not None
        self._held.pop(held.lease_id, None)
        held.lease_id = lease_id
        held.start_lease_id = None
        held.phase = RunPhase.RUNNING
        held.job = held.job.started(attempts, lease_id, started_at)
        held.ctx.attempt = attempts
        self._held[lease_id] = held

    def not_started(self, held: Held) -> None:
        """Let go a reserved job whose start the database refused (its reservation was
        taken, or it was cancelled): its slot frees, no run ended."""
        if not held.finished:
            held.phase = RunPhase.ENDED
            self._running -= 1
        self.forget(held)

    def leases(self) -> list[uuid.UUID]:
        """Return every lease this daemon holds, the ones its starts in flight will write
        included."""
        leases = list(self._held)
        leases.extend(h.start_lease_id for h in self._held.values() if h.start_lease_id)
        return leases

    @property
    def startable(self) -> bool:
        """Say whether a reserved job may start: one waits and a slot is free."""
        return bool(self._waiting) and self.free > 0

    async def wait_changed(self) -> None:
        """Wait for the next change of the holdings."""
        await self._wait_change()

    def take_waiting(self) -> list[Held]:
        """Return every reserved job not started (at stop: they are given back)."""
        taken = list(self._waiting)
        self._waiting.clear()
        for held in taken:
            held.phase = RunPhase.ENDED  # it never took a slot: nothing to release
            self.forget(held)
        self._signal()
        return taken

    def mark_lost(self, held: Held, why: RunStop = RunStop.LEASE_LOST) -> bool:
        """Record that a run lost its lease (``why``: for good, ``SUPERSEDED``) and cancel
        its handler; False if already known."""
        was_lost = held.lost
        if not held.stop_for(why) or was_lost:
            return False
        held.ctx.mark_cancelled()
        if not held.finished:
            held.scope.cancel()
        return True

    def request_cancel(self, held: Held) -> bool:
        """Cancel a run's handler on request; False if already known, stopped otherwise,
        or finished."""
        if held.finished or not held.stop_for(RunStop.CANCEL_REQUESTED):
            return False
        held.ctx.mark_cancelled()
        held.scope.cancel()
        return True

    def request_cancel_of(self, job_id: uuid.UUID) -> bool:
        """Cancel the handler of ``job_id`` if this daemon runs it (a cancel request's
        notification); False if it does not, or knew already."""
        cancelled = False
        for held in self._runs.get(job_id, ()):
            if not (held.lost or held.reserved) and self.request_cancel(held):
                cancelled = True
        return cancelled

    def interrupt(self, held: Held, why: RunStop) -> None:
        """Stop a run whose handler still runs for the daemon's stop or fence (``why``);
        the job is written back."""
        if not held.finished and held.stop_for(why):
            held.ctx.mark_cancelled()
            held.scope.cancel()

    def release_slot(self, held: Held) -> float:
        """Free the slot of a job whose handler has returned; return how long it ran."""
        now = self.clock.monotonic()
        run_s = now - held.started_monotonic
        if not held.finished:
            held.phase = RunPhase.ENDED
            self._running -= 1
            self._last_freed = now
            mean = self._mean_run_s
            self._mean_run_s = run_s if mean is None else mean + _RUN_S_WEIGHT * (run_s - mean)
            self._signal()
        return run_s

    def forget(self, held: Held) -> None:
        """Stop holding a run whose outcome is written or discarded."""
        if self._held.pop(held.lease_id, None) is not None:
            others = [r for r in self._runs.get(held.job.id, ()) if r is not held]
            if others:
                self._runs[held.job.id] = others
            else:
                self._runs.pop(held.job.id, None)
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

    async def wait_claimable(self) -> None:
        """Wait until the claimer may claim: a free slot no reserved job waits for, or
        room among those claimed ahead for at least half a batch (so rounds stay
        batches)."""
        while self.claimable <= 0 or (
            self.free <= self.waiting and self.claimable < max(1, self.ahead_now // 2)
        ):
            await self._wait_change()

    async def wait_waiting(self) -> None:
        """Wait until a job claimed ahead waits for a slot."""
        while not self.waiting:
            self._on_waiting = event = anyio.Event()
            await event.wait()

    async def wait_idle(self) -> None:
        """Wait until no handler runs."""
        while self._running > 0:
            await self._wait_change()

    async def wait_empty(self) -> None:
        """Wait until nothing is held (every outcome written or discarded)."""
        while self._held:
            await self._wait_change()

    async def _wait_change(self) -> None:
        self._watched = True
        await self._changed.wait()

    def _signal(self) -> None:
        # twice per job: a new event only when the last one had waiters
        if self._watched:
            self._watched = False
            self._changed.set()
            self._changed = anyio.Event()
