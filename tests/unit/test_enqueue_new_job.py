"""The Job an insert's row makes (jobsd.store.enqueue.new_job), checked field by field.

``new_job`` builds the frozen dataclass positionally, for speed: these tests compare it
with the same job built by keyword, so a field added to or moved in Job cannot slip.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobsd.jobspec import JobSpec
from jobsd.models import Job, JobStatus
from jobsd.store.enqueue import _decode_payloads, new_job

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
LATER = NOW + timedelta(minutes=5)


def _specs() -> list[JobSpec]:
    plain = JobSpec.build("noop", {"i": 1, "s": "é"}, org_id="org")
    full = JobSpec.build(
        "noop",
        None,
        org_id="org",
        queue="q1",
        dedup_key="k",
        run_after=LATER,
        priority=-5,
        concurrency_key="ck",
    )
    traced = dataclasses.replace(plain, trace_context=json.dumps({"traceparent": "00-ab-cd-01"}))
    return [plain, full, traced]


def _expected(spec: JobSpec, status: str, run_after: datetime) -> Job:
    return Job(
        id=spec.id,
        org_id=spec.org_id,
        type=spec.type,
        queue=spec.queue,
        status=JobStatus(status),
        attempts=0,
        dedup_key=spec.dedup_key,
        payload=json.loads(spec.payload_json),
        progress=None,
        report=None,
        error=None,
        reason=None,
        run_after=run_after,
        lease_id=None,
        worker_id=None,
        created_at=NOW,
        started_at=None,
        finished_at=None,
        cancel_requested_at=None,
        priority=spec.priority,
        concurrency_key=spec.concurrency_key,
        trace_context=json.loads(spec.trace_context) if spec.trace_context else None,
    )


@pytest.mark.parametrize("shape", ["tuple", "dict"])
def test_new_job_is_the_job_built_by_keyword(shape: str) -> None:
    specs = _specs()
    payloads = _decode_payloads(specs)
    for spec, payload in zip(specs, payloads, strict=True):
        status = "scheduled" if spec.run_after else "queued"
        run_after = spec.run_after or NOW
        values = (spec.id, status, run_after, NOW)
        row: Any = (
            values
            if shape == "tuple"
            else dict(zip(("id", "status", "run_after", "created_at"), values, strict=True))
        )
        expected = _expected(spec, status, run_after)

        for job in (new_job(spec, row), new_job(spec, row, payload)):
            assert job == expected
            # equal field by field, types too (an int where a str belongs compares unequal
            # anyway, but a None swapped with a None would not show)
            for field in dataclasses.fields(Job):
                got, want = getattr(job, field.name), getattr(expected, field.name)
                assert (type(got), got) == (type(want), want), field.name
