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

Each run's task is tagged with its job (``jobsd.logs.tag_job``) from its start to its
end: every line logged in the run, the handler's own included, carries the job.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from jobsd import tools
from jobsd.context import JobContext
from jobsd.logs import tag_job, untag_job
from jobsd.models import Job, JobStatus
from jobsd.registry import Registry
from jobsd.tracing import job_span
from jobsd.worker.children import ChildPool, ChildSettings
from jobsd.worker.clock import Clock
from jobsd.worker.decide import End, Facts, Rules, decide
from jobsd.worker.faults import crash_at
from jobsd.worker.holdings import Held, Holdings, RunStop
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
    """Start claimed jobs and see each through to an outcome for ``submit`` (the completer).

    Each run is an asyncio task of its own (its own context, as with a task group),
    created directly: an anyio task group's spawn cost about five times as much (26
    against 4.5 µs per task here), a fifth of the daemon's CPU per no-op job. The runner keeps
    what the task group gave: each run has a cancel scope, ``run`` cancels the runs
    still going when it ends and waits for them to write their jobs back, and a run
    that fails (a bug: ``_execute`` turns every handler error into an outcome) ends
    ``run`` with that error.
    """

    cfg: RunnerSettings
    clock: Clock
    registry: Registry
    holdings: Holdings
    stats: DaemonStats
    submit: Callable[[Held, Outcome], None]
    give_back: Callable[[list[Held]], None] | None = None
    """release reservations not started (the starter's ``release``; None: they end on
    their own, at their ``reserved_until``)"""
    children: ChildPool = field(init=False)
    _runs: dict[asyncio.Task[Outcome], Held] = field(default_factory=dict, init=False)
    """each run's task and what it runs (its ``scope`` is the run's one cancel scope)"""
    _hosting: bool = field(default=False, init=False)
    _crash: BaseException | None = field(default=None, init=False)
    _abandoned: dict[uuid.UUID, threading.Thread] = field(default_factory=dict, init=False)
    _closing: anyio.Event = field(default_factory=anyio.Event, init=False)
    fenced: bool = field(default=False, init=False)
    """the daemon's lease may run out (``fence.py``): no run may go on, none may start"""

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

        A job the claim started takes a slot the claimer booked. A job it reserved ahead
        of the free slots (still queued) waits, held, until the starter starts it when a
        slot frees (``start_reserved``).
        """
        assert self._hosting, "JobRunner.start before run"
        ctx = make_context(job, self.cfg.max_progress_bytes)
        if job.status is JobStatus.QUEUED:
            self.holdings.add_waiting(job, ctx)
            if self._closing.is_set() or self.fenced:  # give it back at once
                self._give_back_waiting()
            return
        self._spawn(self.holdings.add(job, ctx, booked=True))

    def start_reserved(self, held: Held) -> None:
        """Run a reserved job the database has just started (the starter's call)."""
        if self._hosting:
            self._spawn(held)
        else:  # the runner is gone (a stop past its grace): write it back unrun
            self.holdings.release_slot(held)
            self.submit(held, self._ended(held.job, End.SHUTDOWN))

    def _spawn(self, held: Held) -> None:
        # the run's scope (held.scope) exists before its task starts: a cancel in between
        # reaches it. One scope per run for every cancel (lease lost, cancel request,
        # stop): a second scope for the stop alone cost ~5 µs per job.
        if self.fenced:  # started by a claim in flight when the fence closed: stop it
            self.holdings.interrupt(held, RunStop.FENCED)
        task = asyncio.get_running_loop().create_task(self._execute(held))
        self._runs[task] = held
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Outcome]) -> None:
        del self._runs[task]
        if task.cancelled() or self._crash is not None:
            return
        crash = task.exception()
        if crash is not None:
            self._crash = crash
            self._closing.set()  # ``run`` ends and raises it, as a task group would

    def _give_back_waiting(self) -> int:
        """Give back the reservations of the jobs waiting for a slot: they stay queued,
        claimable by any daemon; nothing was charged. Return how many."""
        taken = self.holdings.take_waiting()
        if taken and self.give_back is not None:
            self.give_back(taken)
        return len(taken)

    async def _give_back_stale_waiting(self) -> None:
        """Give back the reserved jobs while every slot stays held by a run that lasts
        (``Holdings.stale_in``): another daemon may have a free slot for them."""
        while True:
            stale_in = self.holdings.stale_in()
            if stale_in is None:
                await self.holdings.wait_waiting()
            elif stale_in > 0:
                await self.clock.sleep(stale_in)
            else:
                given = self._give_back_waiting()
                self.stats.given_back += given
                log.info(
                    "runner.gave_back_waiting",
                    extra={"count": given, "slots": self.holdings.slots},
                )

    async def run_once(self, job: Job) -> Outcome:
        """Hold a claimed job, run it here and submit its outcome; return that outcome."""
        held = self.holdings.add(job, make_context(job, self.cfg.max_progress_bytes))
        return await self._execute(held)

    def _watch_tool_group(self, pgid: int, started: bool) -> None:
        """A tool of a handler in the daemon started or ended: its group is the
        reaper's to end if the daemon dies."""
        if started:
            self.children.reaper.watch(group=pgid)
        else:
            self.children.reaper.forget(group=pgid)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host the handler tasks; after ``close`` wait up to ``grace_s`` for them, cancel
        the rest and return."""
        tools.set_group_watch(self._watch_tool_group)
        try:
            if self._uses_children():
                with anyio.move_on_after(60):
                    await self.children.warm(min(self.cfg.slots, self.cfg.warm_children))
            self._hosting = True
            task_status.started()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._give_back_stale_waiting)
                    await self._closing.wait()
                    tg.cancel_scope.cancel()
                self._give_back_waiting()
                with anyio.move_on_after(self.cfg.grace_s):
                    await self.holdings.wait_idle()
            finally:
                self._hosting = False
                with anyio.CancelScope(shield=True):
                    await self._cancel_runs()
            if self._crash is not None:
                raise self._crash
        finally:
            tools.set_group_watch(None, only_if=self._watch_tool_group)
            with anyio.CancelScope(shield=True):
                await self.children.aclose()

    async def _cancel_runs(self) -> None:
        """Cancel the runs still going and wait until each has written its job back."""
        while self._runs:
            tasks = list(self._runs)
            self.cancel()
            await asyncio.wait(tasks)

    def thread_alive(self, job_id: uuid.UUID) -> bool:
        """Say whether a sync handler's thread abandoned for ``job_id`` still runs."""
        thread = self._abandoned.get(job_id)
        if thread is not None and not thread.is_alive():
            del self._abandoned[job_id]
            return False
        return thread is not None

    def _uses_children(self) -> bool:
        uses = False
        for name in self.registry.types():
            spec = self.registry.get(name)
            if spec is None:
                continue
            if spec.runs_in_process(self.cfg.limits.isolation):
                uses = True
            elif (spec.isolation or self.cfg.limits.isolation) == "auto" and not spec.is_async:
                log.warning(
                    "handler.runs_in_thread",
                    extra={
                        "type": name,
                        "why": "a handler process cannot import it (defined in __main__ "
                        "or in a function): it runs in a thread of the daemon, where a "
                        "timeout cannot stop it",
                    },
                )
        return uses

    def fence(self) -> None:
        """Stop every run now and give back every reservation: the daemon's lease may run
        out. Each run's job is written back as a stop's would be, with cause ``fenced``."""
        self.fenced = True
        self._give_back_waiting()
        for held in list(self._runs.values()):
            self.holdings.interrupt(held, RunStop.FENCED)

    def unfence(self) -> None:
        """Let runs start again: the lease was renewed."""
        self.fenced = False

    def busy(self) -> bool:
        """Say whether any handler of this runner still runs (a sync handler's thread
        abandoned to its fate included)."""
        if any(not held.finished for held in self._runs.values()):
            return True
        return any(thread.is_alive() for thread in self._abandoned.values())

    def close(self) -> None:
        """Start no more jobs: ``run`` gives the running ones ``grace_s``, then cancels them."""
        self._closing.set()

    def cancel(self) -> None:
        """Cancel the running handlers now (a second stop request)."""
        # through each run's scope, as a task group's cancel would: a handler that
        # has just returned is not interrupted on its way out
        for held in list(self._runs.values()):
            self.holdings.interrupt(held, RunStop.SHUTDOWN)

    async def _execute(self, held: Held) -> Outcome:
        # set in the run's own task: its lines carry its job, no other task's do
        ctx = held.ctx
        tag = tag_job(ctx.id, ctx.type, ctx.attempt, ctx.queue, ctx.org_id)
        try:
            job = held.job
            outcome: Outcome | None = None
            try:
                # a run may have lost its lease, or had a cancel request, before its task began
                if held.stop not in (
                    RunStop.CANCEL_REQUESTED,
                    RunStop.LEASE_LOST,
                    RunStop.SUPERSEDED,
                ):
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
                # cancelled from outside the run (``run_once``'s caller): write the job back,
                # then let go
                self._write_back(held)
                raise
            stop = held.stop
            if outcome is None and stop in (RunStop.SHUTDOWN, RunStop.FENCED):
                # the stop past its grace time (``cancel``), or the fence, cancelled the handler
                return self._write_back(held)
            if self.cfg.fault == "after_publish":
                crash_at("after_publish", [str(job.id)])
            took_s = self.holdings.release_slot(held)
            self.stats.run_s.observe(self.stats.label(job.type), took_s)
            if outcome is None and stop is RunStop.CANCEL_REQUESTED:
                outcome = self._ended(job, End.CANCELLED)
            if outcome is None:  # our scope was cancelled: the lease is gone
                outcome = failure("lease lost", reason="lease lost")
            self.submit(held, outcome)
            return outcome
        finally:
            untag_job(tag)

    def _write_back(self, held: Held) -> Outcome:
        """Free the slot of a run the stop interrupted and submit what it becomes."""
        self.holdings.release_slot(held)
        outcome = self._ended(held.job, End.FENCED if held.fenced else End.SHUTDOWN)
        self.submit(held, outcome)
        return outcome

    def _ended(self, job: Job, end: End) -> Outcome:
        """Return what a run stopped from outside its handler becomes (``decide``)."""
        verdict = decide(end, Rules.of(self.registry.get(job.type)), Facts(job.attempts))
        if verdict.status == "failed":
            return failure(verdict.error or verdict.reason, reason=verdict.reason)
        return Outcome(status=str(verdict.status), reason=verdict.reason, error=verdict.error)
