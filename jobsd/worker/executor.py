"""One job's life: take a slot, run the handler, turn whatever happens into an Outcome,
hand it to the completer.

``JobRunner`` starts each claimed job in a task of its own and owns those tasks: at
shutdown it gives them ``grace_s``, then cancels what still runs; a cancelled job is
written back (``queued`` while an ``at_least_once`` type has attempts left, else
``failed``, reason ``shutdown``). A run whose lease was lost (its handler cancelled by
the heartbeat) reports ``lease lost``, which the completer discards; a run cancelled on
request reports ``cancelled``.

A handler exception fails the job at once with a structured cause: the short message
in ``error`` (at most 2 KiB), the type, full message and traceback in ``report``,
unless the type's retry policy matches it and attempts remain: then the job goes to
``scheduled`` (reason ``retry``) with the same cause, to run again after the back-off.
A timeout counts as a ``TimeoutError`` for the policy. A handler never takes the
daemon down with it.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup, TaskStatus

from jobsd.context import JobContext
from jobsd.errors import InvalidPayload
from jobsd.jsonsafe import encode_object
from jobsd.models import Job
from jobsd.registry import HandlerSpec, Registry
from jobsd.tracing import job_span
from jobsd.worker.clock import Clock
from jobsd.worker.holdings import Held, Holdings
from jobsd.worker.stats import DaemonStats

__all__ = [
    "ERROR_MAX_BYTES",
    "JobRunner",
    "Outcome",
    "RunnerSettings",
    "cap_error",
    "failure",
    "make_context",
    "run_handler",
]

log = logging.getLogger(__name__)

ERROR_MAX_BYTES = 2048


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to write for a finished run."""

    status: str
    report_json: str | None = None
    error: str | None = None
    reason: str | None = None
    run_after: datetime | None = None
    delay_s: float | None = None
    """for a ``scheduled`` outcome: run again this long after the write (database clock)"""


def cap_error(text: str) -> str:
    """Cut an error message to at most 2 KiB of UTF-8, on a character boundary."""
    data = text.encode("utf-8", "replace")
    if len(data) <= ERROR_MAX_BYTES:
        return text
    marker = " [truncated]"
    return data[: ERROR_MAX_BYTES - len(marker)].decode("utf-8", "ignore") + marker


def failure(error: str, *, reason: str, detail: dict[str, Any] | None = None) -> Outcome:
    """Build a failed outcome; the full text and ``detail`` go into the report."""
    cause: dict[str, Any] = {"message": error, **(detail or {})}
    report = encode_object({"error": cause}, what="failure report", max_bytes=None)
    return Outcome(status="failed", report_json=report, error=cap_error(error), reason=reason)


def make_context(job: Job) -> JobContext:
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
    )


async def run_handler(job: Job, spec: HandlerSpec | None, ctx: JobContext) -> Outcome:
    """Run the handler of ``job`` and return its outcome; cancellation propagates."""
    if spec is None:
        return failure(f"unknown type {job.type!r}: no handler registered", reason="unknown type")
    try:
        if spec.timeout_s is None:
            result = await _call(spec, ctx)
        else:
            # move_on_after, not fail_after: a TimeoutError raised by the handler's own
            # I/O is a handler error, only our deadline is a timeout
            with anyio.move_on_after(spec.timeout_s) as deadline:
                result = await _call(spec, ctx)
            if deadline.cancelled_caught:
                outcome = failure(f"timeout after {spec.timeout_s:g} s", reason="timeout")
                return _maybe_retry(job, spec, TimeoutError(), outcome)
    except anyio.get_cancelled_exc_class():
        raise
    except (Exception, SystemExit) as exc:
        log.info(
            "job.handler_failed",
            extra={"job_id": str(job.id), "type": job.type, "error": repr(exc)},
        )
        outcome = failure(
            f"{type(exc).__name__}: {exc}",
            reason="handler error",
            detail={
                "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                "traceback": "".join(traceback.format_exception(exc)),
            },
        )
        return _maybe_retry(job, spec, exc, outcome)
    if result is None:
        return Outcome(status="succeeded")
    try:
        report = encode_object(result, what="handler result", max_bytes=None)
    except InvalidPayload as exc:
        return failure(str(exc), reason="invalid report")
    return Outcome(status="succeeded", report_json=report)


def _maybe_retry(job: Job, spec: HandlerSpec, exc: BaseException, failed: Outcome) -> Outcome:
    """Turn a failure into a scheduled retry when the type's policy says so."""
    policy = spec.retry
    if policy is None or not policy.matches(exc) or job.attempts >= spec.max_attempts:
        return failed
    delay_s = policy.delay_s(job.attempts)
    log.info(
        "job.retry_scheduled",
        extra={"job_id": str(job.id), "attempt": job.attempts, "delay_s": round(delay_s, 3)},
    )
    return replace(failed, status="scheduled", reason="retry", delay_s=delay_s)


async def _call(spec: HandlerSpec, ctx: JobContext) -> Any:
    if spec.is_async:
        return await spec.func(ctx)
    # A sync handler cannot be interrupted: on cancellation its thread is abandoned.
    return await anyio.to_thread.run_sync(spec.func, ctx, abandon_on_cancel=True)


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    """How long running handlers may take to finish once the daemon stops claiming."""

    grace_s: float
    """``JOBSD_DRAIN_TIMEOUT``"""


class JobRunner:
    """Start claimed jobs and see each through to an outcome for ``submit`` (the completer)."""

    def __init__(
        self,
        cfg: RunnerSettings,
        clock: Clock,
        registry: Registry,
        holdings: Holdings,
        stats: DaemonStats,
        submit: Callable[[Held, Outcome], None],
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.registry = registry
        self.holdings = holdings
        self.stats = stats
        self.submit = submit
        self._tg: TaskGroup | None = None
        self._closing = anyio.Event()

    def start(self, job: Job) -> None:
        """Hold a claimed job and run it in a task of its own; ``run`` must be running."""
        assert self._tg is not None, "JobRunner.start before run"
        held = self.holdings.add(job, make_context(job))
        self._tg.start_soon(self._execute, held, name=f"job {job.id}")

    async def run_once(self, job: Job) -> Outcome:
        """Hold a claimed job, run it here and submit its outcome; return that outcome."""
        return await self._execute(self.holdings.add(job, make_context(job)))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host the handler tasks; after ``close`` wait up to ``grace_s`` for them, cancel
        the rest and return."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await self._closing.wait()
            with anyio.move_on_after(self.cfg.grace_s):
                await self.holdings.wait_idle()
            tg.cancel_scope.cancel()
        self._tg = None

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
            with held.scope, job_span(job) as span:
                outcome = await run_handler(job, self.registry.get(job.type), held.ctx)
                span.outcome(outcome.status, outcome.reason, outcome.error)
        except anyio.get_cancelled_exc_class():
            # shutdown past the grace time: write the job back, then let go
            self.holdings.release_slot(held)
            self.submit(held, self._interrupted(job))
            raise
        self.holdings.release_slot(held)
        took_s = self.clock.monotonic() - held.started_monotonic
        self.stats.run_s.observe(self.stats.label(job.type), took_s)
        if outcome is None and held.cancel_requested and not held.lost:
            outcome = Outcome(status="cancelled", reason="cancel requested")
        if outcome is None:  # our scope was cancelled: the lease is gone
            outcome = failure("lease lost", reason="lease lost")
        self.submit(held, outcome)
        return outcome

    def _interrupted(self, job: Job) -> Outcome:
        spec = self.registry.get(job.type)
        # an interrupted run's outcome is unknown: only at_least_once may run it again
        if (
            spec is not None
            and spec.delivery == "at_least_once"
            and job.attempts < spec.max_attempts
        ):
            return Outcome(status="queued", reason="shutdown")
        return failure(
            "interrupted: the daemon shut down before the job finished", reason="shutdown"
        )
