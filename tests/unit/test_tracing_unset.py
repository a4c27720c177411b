"""A daemon where OpenTelemetry is installed but never configured records no span."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

# a fresh interpreter: OpenTelemetry allows one tracer provider per process, and the
# tracing tests of this session may have set one already
PROGRAM = textwrap.dedent(
    """
    from types import SimpleNamespace

    from jobsd.tracing import job_span

    job = SimpleNamespace(
        trace_context=None, type="t", id="0", queue="default", attempts=1, org_id="o"
    )
    with job_span(job) as span:
        assert span._span is None, "a span without a configured provider"

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    with job_span(job) as span:
        assert span._span is not None and span._span.is_recording()
    print("ok")
    """
)


def test_no_span_until_the_application_sets_a_tracer_provider() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr
