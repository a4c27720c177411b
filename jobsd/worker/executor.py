"""One job's life: take a slot, run the handler, turn whatever happens into an Outcome,
hand it to the completer.

``JobRunner`` starts each claimed job in a task of its own and owns those tasks: at
shutdown it gives them ``grace_s``, then cancels what still runs; a cancelled job is
written back (``queued`` while an ``at_least_once`` type has attempts left, else
``failed``, reason ``shutdown``). A run whose lease was lost (its handler cancelled by
the heartbeat) reports ``lease lost``, which the completer discards; a run cancelled on
request reports ``cancelled``.

How one handler runs, under which limits, and what its end becomes is ``invoke.py``;
a handler never takes the daemon down with it. A handler exception fails the job at
once with a structured cause: the short message in ``error`` (at most 2 KiB), the
type, full message and traceback in ``report``, unless the type's retry policy matches
it and attempts remain (then ``scheduled``, reason ``retry``).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup, TaskStatus

from jobsd.context import JobContext
from jobsd.models import Job
from jobsd.registry import Registry
from jobsd.tracing import job_span
from jobsd.worker.children import ChildPool, ChildSettings
from jobsd.worker.clock import Clock
from jobsd.worker.faults import crash_at
from jobsd.worker.holdings import Held, Holdings
from jobsd.worker.invoke import RunLimits, run_handler
from jobsd.worker.outcome import ERROR_MAX_BYTES, Outcome, cap_error, failure
from jobsd.worker.stats import DaemonStats

__all__ = [
    "ERROR_MAX_BYTES",
    "JobRunner",
    "Outcome",
    "RunLimits",
    "RunnerSettings",
    "cap_error",
    "failure",
    "make_context",
    "run_handler",
]

log = logging.getLogger(__name__)


def make_context(job: Job, max_progress_bytes: int | None = None) -> JobContext:
    """Build the handler's view of a claimed job."""
    checkpoint = {k: v for k, v in (job.progress or {}).items() if k != "updated_at"}
    return JobContext(
        id=job.id,
        type=job.type,
        org_id=job.org_id,
        queue=job.queue,
        payload=job.payload,
        attempt=job.attempts,
        checkpoint=checkpoint,
        priority=job.priority,
        concurrency_key=job.concurrency_key,
        max_progress_bytes=max_progress_bytes,
    )


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    """How long running handlers may take to finish once the daemon stops claiming, and
    the limits of each run."""

    grace_s: float
    """``JOBSD_DRAIN_TIMEOUT``"""
    limits: RunLimits = field(default_factory=RunLimits)
    kill_grace_s: float = 2.0
    """``JOBSD_KILL_GRACE``: an isolated child's time between SIGTERM and SIGKILL"""
    max_progress_bytes: int | None = None
    """``JOBSD_MAX_PROGRESS_BYTES``"""
    slots: int = 10
    fault: str | None = None
    """``JOBSD_FAULT``: ``after_publish`` exits once a handler returned"""
    warm_children: int = 2
    """children started before the first claim when some type is isolated"""


@dataclass(eq=False, repr=False)
class JobRunner:
    """Start claimed jobs and see each through to an outcome for ``submit`` (the completer)."""

    cfg: RunnerSettings
    clock: Clock
    registry: Registry
    holdings: Holdings
    stats: DaemonStats
    submit: Callable[[Held, Outcome], None]
    children: ChildPool = field(init=False)
    _tg: TaskGroup | None = field(default=None, init=False)
    _abandoned: dict[uuid.UUID, threading.Thread] = field(default_factory=dict, init=False)
    _closing: anyio.Event = field(default_factory=anyio.Event, init=False)

    def __post_init__(self) -> None:
        cfg = self.cfg
        self.children = ChildPool(
            ChildSettings(
                kill_grace_s=cfg.kill_grace_s,
                max_line_bytes=max(
                    cfg.limits.max_report_bytes or 1 << 20, cfg.max_progress_bytes or 1 << 20
                )
                + 65536,
                max_idle=cfg.slots,
            )
        )

    def start(self, job: Job) -> None:
        """Hold a claimed job and run it in a task of its own; ``run`` must be running.

        Without a free slot (a job claimed ahead) it waits, held, until a run ends.
        """
        assert self._tg is not None, "JobRunner.start before run"
        if self.holdings.free <= 0:
            self.holdings.add_waiting(job, make_context(job, self.cfg.max_progress_bytes))
            if self._closing.is_set():  # claimed while stopping: give it back at once
                self._give_back_waiting()
            return
        held = self.holdings.add(job, make_context(job, self.cfg.max_progress_bytes))
        self._tg.start_soon(self._execute, held, name=f"job {job.id}")

    def _start_waiting(self) -> None:
        """Start jobs claimed ahead while slots are free (never once closing)."""
        if self._tg is None or self._closing.is_set():
            return
        while (held := self.holdings.next_waiting()) is not None:
            self._tg.start_soon(self._execute, held, name=f"job {held.job.id}")

    def _give_back_waiting(self) -> None:
        """Hand the jobs claimed ahead and never started to the completer: back to
        ``queued`` (reason ``not started``), whatever their delivery: no handler ran."""
        for held in self.holdings.take_waiting():
            self.submit(held, Outcome(status="queued", reason="not started"))

    async def run_once(self, job: Job) -> Outcome:
        """Hold a claimed job, run it here and submit its outcome; return that outcome."""
        held = self.holdings.add(job, make_context(job, self.cfg.max_progress_bytes))
        return await self._execute(held)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host the handler tasks; after ``close`` wait up to ``grace_s`` for them, cancel
        the rest and return."""
        try:
            if self._uses_children():
                with anyio.move_on_after(60):
                    await self.children.warm(min(self.cfg.slots, self.cfg.warm_children))
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await self._closing.wait()
                self._give_back_waiting()
                with anyio.move_on_after(self.cfg.grace_s):
                    await self.holdings.wait_idle()
                tg.cancel_scope.cancel()
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True):
                await self.children.aclose()

    def thread_alive(self, job_id: uuid.UUID) -> bool:
        """Say whether a sync handler's thread abandoned for ``job_id`` still runs."""
        thread = self._abandoned.get(job_id)
        if thread is not None and not thread.is_alive():
            del self._abandoned[job_id]
            return False
        return thread is not None

    def _uses_children(self) -> bool:
        for name in self.registry.types():
            spec = self.registry.get(name)
            if spec is not None and (spec.isolation or self.cfg.limits.isolation) == "process":
                return True
        return False

    def close(self) -> None:
        """Start no more jobs: ``run`` gives the running ones ``grace_s``, then cancels them."""
        self._closing.set()

    def cancel(self) -> None:
        """Cancel the running handlers now (a second stop request)."""
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    async def _execute(self, held: Held) -> Outcome:
        job = held.job
        outcome: Outcome | None = None
        try:
            # a job claimed ahead may have lost its lease or been cancelled while waiting
            if not (held.lost or held.cancel_requested):
                with held.scope, job_span(job) as span:
                    outcome = await run_handler(
                        job,
                        self.registry.get(job.type),
                        held.ctx,
                        self.cfg.limits,
                        self.children,
                        self._abandoned,
                    )
                    span.outcome(outcome.status, outcome.reason, outcome.error)
        except anyio.get_cancelled_exc_class():
            # shutdown past the grace time: write the job back, then let go
            self.holdings.release_slot(held)
            self.submit(held, self._interrupted(job))
            raise
        if self.cfg.fault == "after_publish":
            crash_at("after_publish", [str(job.id)])
        self.holdings.release_slot(held)
        self._start_waiting()
        took_s = self.clock.monotonic() - held.started_monotonic
        self.stats.run_s.observe(self.stats.label(job.type), took_s)
        if outcome is None and held.cancel_requested and not held.lost:
            outcome = self._cancelled(job)
        if outcome is None:  # our scope was cancelled: the lease is gone
            outcome = failure("lease lost", reason="lease lost")
        self.submit(held, outcome)
        return outcome

    def _ask_recover(self, job: Job, reason: str, error: str) -> Outcome | None:
        """Return ``recovery_required`` for an at_most_once type with a recover hook (a
        run stopped mid-way: whether its work happened is for the hook to say), else None."""
        spec = self.registry.get(job.type)
        if spec is not None and spec.delivery == "at_most_once" and spec.recover is not None:
            return Outcome(status="recovery_required", reason=reason, error=error)
        return None

    def _cancelled(self, job: Job) -> Outcome:
        unknown = self._ask_recover(
            job, "cancel requested", "cancelled while running: outcome unknown"
        )
        return unknown or Outcome(status="cancelled", reason="cancel requested")

    def _interrupted(self, job: Job) -> Outcome:
        message = "interrupted: the daemon shut down before the job finished"
        unknown = self._ask_recover(job, "shutdown", message)
        if unknown is not None:
            return unknown
        spec = self.registry.get(job.type)
        # an interrupted run's outcome is unknown: only at_least_once may run it again
        if (
            spec is not None
            and spec.delivery == "at_least_once"
            and job.attempts < spec.max_attempts
        ):
            return Outcome(status="queued", reason="shutdown")
        return failure(message, reason="shutdown")
