"""OpenTelemetry, for applications that use it (the optional extra ``jobsd[otel]``).

An enqueue records the W3C trace context of the caller's current span with the job
(``jobs.trace_context``: ``traceparent``, ``tracestate``); the daemon runs the
handler in a span whose parent is that context, linked to it too, so the request and
the job it caused show as one trace. The span (``jobsd.run <type>``, kind consumer)
carries the job's id, type, queue, attempt and outcome.

Nothing here imports ``opentelemetry`` at import time. The enqueue side looks only if
the application has imported ``opentelemetry.trace`` already (without it, there is no
span to propagate); the daemon side only if the package is installed. Without the
extra nothing is imported and nothing changes.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobsd.models import Job

__all__ = ["current_trace_context", "job_span"]

_TRACER_NAME = "jobsd"
_installed: bool | None = None


def current_trace_context() -> str | None:
    """Return the caller's trace context as JSON (``{"traceparent": ...}``), or None."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return json.dumps(carrier, sort_keys=True) if carrier.get("traceparent") else None


def _otel_installed() -> bool:
    global _installed
    if _installed is None:
        _installed = importlib.util.find_spec("opentelemetry") is not None
    return _installed


class JobSpan:
    """The span of one run: set its outcome before it ends."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def outcome(self, status: str, reason: str | None = None, error: str | None = None) -> None:
        """Record how the run ended (succeeded, failed, ...) on the span."""
        if self._span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attribute("jobsd.outcome", status)
        if reason:
            self._span.set_attribute("jobsd.reason", reason)
        if status == "failed":
            self._span.set_status(Status(StatusCode.ERROR, error or reason))


_NO_SPAN = JobSpan(None)


def job_span(job: Job) -> AbstractContextManager[JobSpan]:
    """Run the block in the span of ``job``'s run (a no-op without OpenTelemetry)."""
    if not _otel_installed():
        return nullcontext(_NO_SPAN)
    from opentelemetry import trace

    unset = trace.ProxyTracerProvider | trace.NoOpTracerProvider
    if isinstance(trace.get_tracer_provider(), unset):
        # installed (often as another package's dependency) but never configured: no
        # span would be recorded, so the run pays for none (about 7 % of a no-op job)
        return nullcontext(_NO_SPAN)
    return _recorded_span(job)


@contextmanager
def _recorded_span(job: Job) -> Iterator[JobSpan]:
    from opentelemetry import propagate, trace

    parent = None
    links = []
    if job.trace_context:
        parent = propagate.extract(job.trace_context)
        linked = trace.get_current_span(parent).get_span_context()
        if linked.is_valid:
            links.append(trace.Link(linked))
    tracer = trace.get_tracer(_TRACER_NAME)
    with tracer.start_as_current_span(
        f"jobsd.run {job.type}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes={
            "jobsd.job.id": str(job.id),
            "jobsd.job.type": job.type,
            "jobsd.queue": job.queue,
            "jobsd.attempt": job.attempts,
            "jobsd.org_id": job.org_id,
        },
        record_exception=False,
    ) as span:
        yield JobSpan(span)
