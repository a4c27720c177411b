"""Run one handler under its limits and turn whatever happens into an Outcome.

Where the handler runs: async in the event loop, sync in a daemon thread of its own,
or (``isolation="process"``) in a child process of ``children.py``. What bounds it:
its type's ``timeout`` and ``stall_after`` (a watchdog task cancels the run), the
report and progress caps. A timeout or stall stops the work; a sync handler in the
daemon cannot be stopped, so its job becomes ``recovery_required`` (outcome unknown).
A handler exception, whatever it is (cancellation aside), fails the job at once with
a structured cause, unless the type's retry policy matches it and attempts remain.
A timeout counts as a ``TimeoutError`` for the policy.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, replace
from typing import Any, assert_never

import anyio
import anyio.from_thread
import anyio.lowlevel

from jobsd.context import JobContext, ProgressTooLarge
from jobsd.errors import ConfigError, InvalidPayload, JobsdError, PayloadTooLarge
from jobsd.jsonsafe import encode_object
from jobsd.models import Job
from jobsd.registry import HandlerSpec, Isolation
from jobsd.worker.children import Answer, Child, ChildLimits, ChildPool
from jobsd.worker.decide import End, Facts, Rules, Verdict, decide
from jobsd.worker.outcome import Outcome, failure

__all__ = ["RunLimits", "handler_ref", "run_handler", "stall_check_s"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunLimits:
    """What bounds one run: the daemon's defaults for types that do not say."""

    isolation: Isolation = "auto"
    stall_after_s: float | None = None
    max_jobs_per_child: int | None = None
    max_child_memory: int | None = None
    max_report_bytes: int | None = None
    default_timeout_s: float | None = None
    """the timeout of the types that give none (``JOBSD_DEFAULT_TIMEOUT``)"""


@dataclass(slots=True)
class _Watch:
    """Why the watchdog of a run ended it, if it did."""

    ended: str | None = None
    """``timeout`` or ``stalled``"""
    limit_s: float = 0.0


def stall_check_s(stall_after_s: float) -> float:
    """Return how often a run's progress is checked: a quarter of ``stall_after``, at
    most 1 s. A stalled run ends within ``stall_after`` plus this."""
    return min(1.0, stall_after_s / 4)


async def _watchdog(
    ctx: JobContext,
    scope: anyio.CancelScope,
    watch: _Watch,
    timeout_s: float | None,
    stall_after_s: float | None,
) -> None:
    """Cancel ``scope`` at the timeout, or once ``ctx`` made no progress for
    ``stall_after_s``; record which in ``watch``."""
    start = time.monotonic()
    while True:
        now = time.monotonic()
        wake = float("inf")
        if timeout_s is not None:
            if now - start >= timeout_s:
                watch.ended, watch.limit_s = "timeout", timeout_s
                scope.cancel()
                return
            wake = start + timeout_s
        if stall_after_s is not None:
            if now - ctx.last_activity >= stall_after_s:
                watch.ended, watch.limit_s = "stalled", stall_after_s
                scope.cancel()
                return
            wake = min(wake, now + stall_check_s(stall_after_s))
        await anyio.sleep(max(wake - now, 0.0))


def handler_ref(spec: HandlerSpec) -> str | None:
    """Return ``module:qualname`` of a handler a child process can import, else None."""
    return spec.import_ref


def _child_limits(spec: HandlerSpec, limits: RunLimits) -> ChildLimits:
    """When the handler process of a run of ``spec`` is replaced: the type's limits,
    else the daemon's."""
    return ChildLimits(
        max_jobs=spec.max_jobs_per_child or limits.max_jobs_per_child,
        max_memory=spec.max_child_memory or limits.max_child_memory,
    )


async def run_handler(
    job: Job,
    spec: HandlerSpec | None,
    ctx: JobContext,
    limits: RunLimits | None = None,
    children: ChildPool | None = None,
    abandoned: dict[uuid.UUID, threading.Thread] | None = None,
) -> Outcome:
    """Run the handler of ``job`` and return its outcome; cancellation propagates.

    A timeout or a stall cancels the handler. An async handler stops; an isolated one
    has its child killed; a sync one in the daemon cannot be stopped: its thread is
    abandoned and its job becomes ``recovery_required`` (the outcome is unknown).
    """
    if spec is None:
        return failure(f"unknown type {job.type!r}: no handler registered", reason="unknown type")
    limits = limits or RunLimits()
    isolated = spec.runs_in_process(limits.isolation)
    stall_after_s = spec.stall_after_s if spec.stall_after_s is not None else limits.stall_after_s
    timeout_s = limits.default_timeout_s if spec.timeout_default else spec.timeout_s
    watch = _Watch()
    thread = _ThreadBox()
    raised: BaseException | None = None
    answer: Any = None
    child: Child | None = None
    try:
        child = await _child_for(spec, children) if isolated else None
        ctx.last_activity = time.monotonic()  # limits count from here, not the child's start

        async def call() -> Any:
            if child is not None and children is not None:
                return await children.run(child, _ref(spec), ctx, _child_limits(spec, limits))
            if isolated:
                raise ConfigError(
                    f"handler of {spec.type!r} cannot run in a child process: "
                    "isolation='process' needs a module-level function"
                )
            return await _call(spec, ctx, thread)

        if timeout_s is None and stall_after_s is None:
            answer = await call()  # no limits: no watchdog task, no scope on the hot path
        elif stall_after_s is None and timeout_s is not None:
            # a timeout alone: the scope's own deadline (a timer), no watchdog task
            limit_s = timeout_s
            with anyio.CancelScope(deadline=anyio.current_time() + limit_s) as deadline:
                answer = await call()
            if deadline.cancelled_caught:
                watch.ended, watch.limit_s = "timeout", limit_s
                _abandon(job, thread, isolated, abandoned)
                return _ended_by_watch(job, spec, ctx, watch, thread, isolated)
        else:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_watchdog, ctx, scope, watch, timeout_s, stall_after_s)
                    try:
                        answer = await call()
                    except anyio.get_cancelled_exc_class():
                        raise
                    except BaseException as exc:  # a handler's, whatever it is
                        # raised outside the task group, or it would come as a group
                        raised = exc
                    tg.cancel_scope.cancel()
            if raised is not None:
                raise raised
            if watch.ended is not None and scope.cancelled_caught:
                _abandon(job, thread, isolated, abandoned)
                return _ended_by_watch(job, spec, ctx, watch, thread, isolated)
    except anyio.get_cancelled_exc_class():
        # cancelled from outside (a stop, the fence, a lost lease): a sync handler's
        # thread may go on; it is told, and remembered while it runs
        ctx.mark_cancelled()
        _abandon(job, thread, isolated, abandoned)
        raise
    except ProgressTooLarge:
        return failure(ctx.progress_too_large or "progress too large", reason="progress too large")
    except BaseException as exc:  # KeyboardInterrupt, GeneratorExit, ...
        # anything a handler raises but cancellation fails its job, never the daemon
        if ctx.progress_too_large is not None:
            return failure(ctx.progress_too_large, reason="progress too large")
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
        verdict = decide(End.RAISED, Rules.of(spec), _facts(job, spec, exc))
        return _as_decided(job, spec, verdict, outcome)
    if ctx.progress_too_large is not None:
        return failure(ctx.progress_too_large, reason="progress too large")
    if isinstance(answer, Answer):
        return _isolated_outcome(job, spec, answer, limits)
    if answer is None:
        return Outcome(status="succeeded")
    try:
        report = encode_object(answer, what="handler result", max_bytes=limits.max_report_bytes)
    except PayloadTooLarge as exc:
        return failure(f"report too large: {exc}", reason="report too large")
    except InvalidPayload as exc:
        return failure(str(exc), reason="invalid report")
    return Outcome(status="succeeded", report_json=report)


def _abandon(
    job: Job,
    thread: _ThreadBox,
    isolated: bool,
    abandoned: dict[uuid.UUID, threading.Thread] | None,
) -> None:
    """Remember a sync handler's thread that a limit could not stop (it may still run)."""
    if not isolated and thread.thread is not None and thread.alive and abandoned is not None:
        abandoned[job.id] = thread.thread


def _ended_by_watch(
    job: Job,
    spec: HandlerSpec,
    ctx: JobContext,
    watch: _Watch,
    thread: _ThreadBox,
    isolated: bool,
) -> Outcome:
    ctx.mark_cancelled()  # a sync handler that checks ctx.cancelled may still stop
    what = (
        f"timeout after {watch.limit_s:g} s"
        if watch.ended == "timeout"
        else f"stalled: no progress for {watch.limit_s:g} s"
    )
    end = End.STALLED if watch.ended == "stalled" else End.TIMEOUT
    stuck = not isolated and thread.alive
    facts = replace(_facts(job, spec, TimeoutError(what)), thread_alive=stuck)
    verdict = decide(end, Rules.of(spec), facts)
    if stuck:
        # the thread cannot be stopped: whether its work happens is unknown, and the
        # job must not run again while it may still be running
        log.warning("job.thread_abandoned", extra={"job_id": str(job.id), "why": str(end)})
        what = f"{what}; the handler's thread could not be stopped: outcome unknown"
    # the record's cause is what ended the attempt, also when its reason is a retry's
    return _as_decided(job, spec, verdict, failure(what, reason=verdict.reason, cause=str(end)))


def _isolated_outcome(job: Job, spec: HandlerSpec, answer: Answer, limits: RunLimits) -> Outcome:
    match answer.kind:
        case "result":
            if answer.report is None:
                return Outcome(status="succeeded")
            try:
                report = encode_object(
                    answer.report, what="handler result", max_bytes=limits.max_report_bytes
                )
            except PayloadTooLarge as exc:
                return failure(f"report too large: {exc}", reason="report too large")
            return Outcome(status="succeeded", report_json=report)
        case "error":
            detail = dict(answer.detail or {})
            mro = detail.pop("mro", [])
            outcome = failure(answer.message, reason="handler error", detail=detail)
            verdict = decide(End.RAISED, Rules.of(spec), _facts(job, spec, _RemoteError(mro)))
            return _as_decided(job, spec, verdict, outcome)
        case "invalid":
            return failure(answer.message, reason="invalid report")
        case "too_large":
            return failure(answer.message, reason="report too large")
        case "progress_too_large":
            return failure(answer.message, reason="progress too large")
        case "crashed" | "memory":
            log.warning("job.child_lost", extra={"job_id": str(job.id), "how": answer.message})
            end = End.MEMORY if answer.kind == "memory" else End.CRASHED
            outcome = failure(answer.message, reason=str(end), detail=answer.detail)
            verdict = decide(end, Rules.of(spec), Facts(job.attempts))
            return _as_decided(job, spec, verdict, outcome)
        case _:
            assert_never(answer.kind)


class _RemoteError(Exception):
    """An exception raised in a child, for the retry policy: matched by the names of its
    type and base types."""

    def __init__(self, mro: list[str]) -> None:
        super().__init__(mro[0] if mro else "")
        self.mro = mro


def _facts(job: Job, spec: HandlerSpec, exc: BaseException) -> Facts:
    """Return what ``decide`` needs to know of a run that ended with ``exc``: its
    attempt, and whether the type's retry policy matches ``exc``."""
    policy = spec.retry
    if policy is None:
        matched = False
    elif isinstance(exc, _RemoteError):
        matched = policy.matches_names(exc.mro)
    else:
        matched = policy.matches(exc)
    return Facts(job.attempts, retry_matches=matched)


def _as_decided(job: Job, spec: HandlerSpec, verdict: Verdict, failed: Outcome) -> Outcome:
    """Give a failure the state ``decide`` chose: a retry after the policy's delay, an
    outcome left to the recover hook (or an operator), or the failure itself."""
    if verdict.status == "scheduled":
        assert spec.retry is not None, "a retry needs a policy"
        delay_s = spec.retry.delay_s(job.attempts)
        log.info(
            "job.retry_scheduled",
            extra={"job_id": str(job.id), "attempt": job.attempts, "delay_s": round(delay_s, 3)},
        )
        return replace(failed, status="scheduled", reason=verdict.reason, delay_s=delay_s)
    return replace(failed, status=str(verdict.status), reason=verdict.reason)


@dataclass(slots=True)
class _ThreadBox:
    """The thread of a sync handler run in the daemon, if any."""

    thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


async def _call(spec: HandlerSpec, ctx: JobContext, box: _ThreadBox) -> Any:
    if spec.is_async:
        return await spec.func(ctx)
    # A sync handler cannot be interrupted: on cancellation its thread is abandoned. It
    # is a daemon thread of its own, not one of AnyIO's: an abandoned AnyIO worker
    # thread would keep the process from exiting at shutdown.
    done = anyio.Event()
    token = anyio.lowlevel.current_token()
    result: list[Any] = []
    error: list[BaseException] = []
    # a new thread starts with an empty context: the handler runs in a copy of the
    # run's, so its log lines carry its job (jobsd.logs)
    context = contextvars.copy_context()

    def target() -> None:
        try:
            result.append(context.run(spec.func, ctx))
        except BaseException as exc:  # handed to the event loop, raised there
            error.append(exc)
        finally:
            # RuntimeError: the loop is gone, nobody waits any more
            with contextlib.suppress(RuntimeError):
                anyio.from_thread.run_sync(done.set, token=token)

    box.thread = threading.Thread(target=target, name=f"job {ctx.id}", daemon=True)
    box.thread.start()
    await done.wait()
    if error:
        raise error[0]
    return result[0]


def _ref(spec: HandlerSpec) -> str:
    ref = handler_ref(spec)
    assert ref is not None, "checked by _child_for"
    return ref


async def _child_for(spec: HandlerSpec, children: ChildPool | None) -> Child | None:
    """Take a child for an isolated run; None when the handler cannot run in one (the
    run then fails with a ConfigError naming why)."""
    if children is None or handler_ref(spec) is None:
        return None
    try:
        return await children.acquire()
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as exc:  # the run fails, not the daemon
        raise ChildStartError(f"cannot start a handler process: {exc!r}") from exc


class ChildStartError(JobsdError):
    """A child process for an isolated handler could not be started."""
