"""Run one job's handler and turn whatever happens into an Outcome.

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
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import anyio
import anyio.to_thread

from jobsd.context import JobContext
from jobsd.errors import InvalidPayload
from jobsd.jsonsafe import encode_object
from jobsd.models import Job
from jobsd.registry import HandlerSpec

__all__ = ["ERROR_MAX_BYTES", "Outcome", "cap_error", "failure", "make_context", "run_handler"]

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
