"""Find the jobs a test enqueued that match what it expects, and say why none did.

A job matches when its ``type`` is the one given, its payload holds every key of the
``payload`` given with an equal value (a subset: keys not given are not looked at;
``unittest.mock.ANY`` matches any value), and every other field given (``queue``,
``org_id``, ``priority``, ``dedup_key``, ``status``, ... any field of ``jobsd.Job``)
is equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from jobsd.models import Job

__all__ = ["Expected", "mismatches", "no_match_message"]

JOB_FIELDS = frozenset(f.name for f in dataclasses.fields(Job))
_MISSING = object()
_LISTED = 20
"""the most jobs a failure message lists"""


@dataclasses.dataclass(frozen=True, slots=True)
class Expected:
    """What a test expects of an enqueued job; None: anything."""

    type: str | None = None
    payload: Mapping[str, Any] | None = None
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.fields) - JOB_FIELDS)
        if unknown:
            raise TypeError(
                f"no such job field: {', '.join(unknown)} (fields: {', '.join(sorted(JOB_FIELDS))})"
            )

    def matches(self, job: Job) -> bool:
        """Say whether ``job`` is what is expected."""
        return not mismatches(job, self)

    def describe(self) -> str:
        """Say what is expected, as a test would write it."""
        parts = []
        if self.type is not None:
            parts.append(f"type={self.type!r}")
        if self.payload is not None:
            parts.append(f"payload containing {dict(self.payload)!r}")
        parts += [f"{name}={value!r}" for name, value in self.fields.items()]
        return ", ".join(parts) or "anything"


def mismatches(job: Job, expected: Expected) -> list[str]:
    """Return each way ``job`` differs from ``expected`` (empty: it matches)."""
    found: list[str] = []
    if expected.type is not None and job.type != expected.type:
        found.append(f"type is {job.type!r}, not {expected.type!r}")
    if expected.payload is not None:
        for key, value in expected.payload.items():
            actual = job.payload.get(key, _MISSING)
            if actual is _MISSING:
                found.append(f"payload has no {key!r}")
            elif value != actual:
                found.append(f"payload[{key!r}] is {actual!r}, not {value!r}")
    for name, value in expected.fields.items():
        actual = getattr(job, name)
        if value != actual:
            found.append(f"{name} is {actual!r}, not {value!r}")
    return found


def _line(job: Job) -> str:
    return (
        f"{job.type} (org_id={job.org_id!r}, queue={job.queue!r}, status={str(job.status)!r}) "
        f"payload={job.payload!r}"
    )


def no_match_message(expected: Expected, jobs: Sequence[Job], *, count: int | None = None) -> str:
    """Explain why ``jobs`` (every job enqueued in the test) fail ``expected``: each job
    with how it differs, the jobs of the expected type first."""
    matching = [job for job in jobs if expected.matches(job)]
    if count is None:
        head = f"no job enqueued in this test matches {expected.describe()}"
    else:
        head = (
            f"expected {count} job{'s' if count != 1 else ''} matching {expected.describe()}, "
            f"found {len(matching)}"
        )
    if not jobs:
        return f"{head}: no job was enqueued in this test"
    ordered = sorted(jobs, key=lambda job: expected.type is not None and job.type != expected.type)
    lines = [f"{head}; enqueued in this test ({len(jobs)}):"]
    for job in ordered[:_LISTED]:
        lines.append(f"  - {_line(job)}")
        differs = mismatches(job, expected)
        lines.append(f"      {'; '.join(differs)}" if differs else "      matches")
    if len(jobs) > _LISTED:
        lines.append(f"  ... and {len(jobs) - _LISTED} more")
    return "\n".join(lines)
