"""OpenTelemetry (issue 14): the enqueue records the caller's trace context with the job
and the daemon runs the handler in a span of that trace (in-memory exporter); without
OpenTelemetry in use, nothing is imported and nothing is recorded."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import jobsd
from jobsd.registry import Registry

from .conftest import ADb, make_settings, running_daemon

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once: OpenTelemetry allows no second one)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


async def test_one_trace_from_the_request_to_the_handler(
    db_url: str, db: ADb, client: jobsd.Client, exporter: InMemorySpanExporter
) -> None:
    registry = Registry()
    seen: list[int] = []

    @jobsd.handler("traced", registry=registry)
    async def traced(ctx: jobsd.JobContext) -> None:
        seen.append(trace.get_current_span().get_span_context().trace_id)
        if ctx.payload.get("fail"):
            raise RuntimeError("boom")

    tracer = trace.get_tracer("the-app")
    with tracer.start_as_current_span("POST /imports") as request:
        job = await client.enqueue("traced", org_id="acme")
        failing = await client.enqueue("traced", {"fail": True}, org_id="acme")
    untraced = await client.enqueue("traced", org_id="acme")
    assert job.trace_context is not None and "traceparent" in job.trace_context
    assert untraced.trace_context is None
    async with running_daemon(make_settings(db_url), registry):
        for waited in (job, failing, untraced):
            assert (await client.wait(waited.id, timeout_s=20)).status.terminal
    runs = {
        s.attributes["jobsd.job.id"]: s
        for s in exporter.get_finished_spans()
        if s.name == "jobsd.run traced"
    }
    req = request.get_span_context()
    run = runs[str(job.id)]
    assert run.context.trace_id == req.trace_id
    assert req.trace_id in seen  # the handler runs inside the span
    assert run.parent is not None and run.parent.span_id == req.span_id
    assert [link.context.span_id for link in run.links] == [req.span_id]
    assert run.kind == trace.SpanKind.CONSUMER
    for key, value in {
        "jobsd.job.type": "traced",
        "jobsd.queue": "default",
        "jobsd.attempt": 1,
        "jobsd.outcome": "succeeded",
    }.items():
        assert run.attributes[key] == value, key
    failed = runs[str(failing.id)]
    assert failed.attributes["jobsd.outcome"] == "failed"
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert failed.context.trace_id == req.trace_id
    # a job enqueued outside any span runs in a trace of its own
    alone = runs[str(untraced.id)]
    assert alone.parent is None and alone.context.trace_id != req.trace_id


def test_without_opentelemetry_in_use_nothing_is_imported() -> None:
    code = (
        "import sys, jobsd\n"
        "from jobsd.client import JobSpec\n"
        "import jobsd.worker.supervisor\n"
        "spec = JobSpec.build('t', {}, org_id='o')\n"
        "print(spec.trace_context, any(m.startswith('opentelemetry') for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["None", "False"], out.stderr
