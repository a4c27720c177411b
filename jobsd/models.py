"""What a job is: its states, and the rows jobsd reads back (jobs, their events, queues)."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = [
    "INITIAL_STATES",
    "OPEN_STATES",
    "QUEUE_NAME_PATTERN",
    "STATUS_BY_VALUE",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "ErrorRecord",
    "Job",
    "JobEvent",
    "JobStatus",
    "JobView",
    "QueueInfo",
    "error_records",
    "last_progress_at",
    "silence_s",
    "split_traceback",
]


# The CHECK constraint of jobsd.queues.name (migration 0001).
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$"


class JobStatus(enum.StrEnum):
    """The one vocabulary of job states."""

    QUEUED = "queued"
    SCHEDULED = "scheduled"
    BLOCKED = "blocked"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RECOVERY_REQUIRED = "recovery_required"

    @property
    def terminal(self) -> bool:
        """Say whether the state can never change again."""
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
# The states of a job not yet ended, in the machine's order: what a queue's depth,
# its capacity and a snapshot count.
OPEN_STATES: tuple[str, ...] = tuple(str(s) for s in JobStatus if s not in TERMINAL_STATES)

INITIAL_STATES = frozenset({JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.BLOCKED})

# The edges of the state machine (docs/states.md). The database enforces the same
# table (migration 0005, jobsd.transition_allowed); tests check they agree.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.CANCELLED}),
    JobStatus.SCHEDULED: frozenset({JobStatus.QUEUED, JobStatus.CANCELLED}),
    JobStatus.BLOCKED: frozenset(
        {JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    JobStatus.RUNNING: frozenset(
        {
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
            JobStatus.CANCELLED,
            JobStatus.QUEUED,
            JobStatus.SCHEDULED,
            JobStatus.RECOVERY_REQUIRED,
        }
    ),
    JobStatus.RECOVERY_REQUIRED: frozenset(
        {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.QUEUED, JobStatus.CANCELLED}
    ),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}

# the columns every version of jobsd.jobs has (migration 0001), read as they are
_JOB_COLUMNS = (
    "id",
    "org_id",
    "type",
    "queue",
    "attempts",
    "dedup_key",
    "payload",
    "progress",
    "report",
    "error",
    "reason",
    "run_after",
    "lease_id",
    "worker_id",
    "created_at",
    "started_at",
    "finished_at",
)


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    """One attempt of a job that ended in an error: an element of ``Job.errors``.

    Written by the daemon with the attempt's outcome, in the same statement (migration
    0028); the last ten such attempts are kept. Texts are capped: ``message`` at 2 KiB
    (as ``Job.error``), ``traceback`` at 16 KiB, keeping its end after a first line
    that says how many bytes were cut.
    """

    attempt: int
    """the attempt that ended (``Job.attempts`` then)"""
    at: datetime
    """when its end was written, on the database's clock"""
    type: str | None
    """the exception's class, ``module.Qualname``; None when none was raised (a
    timeout, a stall, a crashed handler process, a lost worker)"""
    message: str
    traceback: str | None
    cause: str
    """why the attempt ended, in the words of ``Job.reason``: ``handler error``,
    ``timeout``, ``stalled``, ``handler crashed``, ``memory limit``, ``worker lost``,
    ``shutdown``... (an attempt that is retried says why here, its job's reason says
    ``retry``)"""

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ErrorRecord:
        """Build from a stored record; ValueError, TypeError or KeyError when it is not one."""
        at = value["at"]
        kind, traceback = value.get("type"), value.get("traceback")
        return cls(
            attempt=int(value["attempt"]),
            at=at if isinstance(at, datetime) else datetime.fromisoformat(at),
            type=str(kind) if kind is not None else None,
            message=str(value.get("message") or ""),
            traceback=str(traceback) if traceback is not None else None,
            cause=str(value.get("cause") or ""),
        )

    def to_json(self) -> dict[str, Any]:
        """Return the record as stored and as the API shows it (``at`` in ISO 8601)."""
        return {
            "attempt": self.attempt,
            "at": self.at.isoformat(),
            "type": self.type,
            "message": self.message,
            "traceback": self.traceback,
            "cause": self.cause,
        }


def error_records(value: Any) -> list[ErrorRecord]:
    """Return the records of a ``jobs.errors`` value, most recent first (as stored);
    an element that is no record (written by hand) is left out rather than failing
    the read of its job."""
    if not isinstance(value, list):
        return []
    records = []
    for item in value:
        if not isinstance(item, Mapping):
            continue
        try:
            records.append(ErrorRecord.from_json(item))
        except (KeyError, TypeError, ValueError):
            continue
    return records


STATUS_BY_VALUE: dict[str, JobStatus] = {str(status): status for status in JobStatus}
"""a status column's text to its JobStatus: a dict lookup, cheaper per row than the
enum's call where rows come by the hundred (claims, finishes, bulk inserts)"""


@dataclass(frozen=True, slots=True)
class Job:
    """A row of ``jobsd.jobs``."""

    id: uuid.UUID
    org_id: str
    type: str
    queue: str
    status: JobStatus
    attempts: int
    dedup_key: str | None
    payload: dict[str, Any]
    progress: dict[str, Any] | None
    report: dict[str, Any] | None
    error: str | None
    reason: str | None
    run_after: datetime
    lease_id: uuid.UUID | None
    worker_id: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested_at: datetime | None = None
    """set while a cancel request waits for a running job's owner (migration 0006)"""
    priority: int = 0
    """lower runs first; FIFO within a priority (migration 0008)"""
    concurrency_key: str | None = None
    """jobs sharing a key run at most the key's limit at once (migration 0008)"""
    trace_context: dict[str, str] | None = None
    """the W3C trace context of the enqueue, with OpenTelemetry (migration 0014)"""
    reserved_until: datetime | None = None
    """set while the job is queued and reserved by a daemon (``worker_id``, under
    ``lease_id``) ahead of its free slots: no other claim takes it until then (a job
    cancelled while reserved keeps it: ``reservation`` reads it only while queued)"""
    retry_of: uuid.UUID | None = None
    """the failed or cancelled job this job retries (None: not a retry)"""
    retried_as: uuid.UUID | None = None
    """the job that retries this one, once it was retried (read with the job, never
    stored in its row: a finished job's row does not change)"""
    errors: list[ErrorRecord] = field(default_factory=list)
    """the last attempts that ended in an error, most recent first (at most 10; none
    for a job that never failed an attempt); ``error``, ``reason`` and ``report`` say
    the last attempt's alone (migration 0028). A job the daemon claims has none
    (its claim does not read them)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Job:
        """Build a job from a dict row; unknown columns (added by later migrations) are ignored."""
        return cls(
            **{name: row[name] for name in _JOB_COLUMNS},
            status=JobStatus(row["status"]),
            cancel_requested_at=row.get("cancel_requested_at"),
            priority=row.get("priority", 0),
            concurrency_key=row.get("concurrency_key"),
            trace_context=row.get("trace_context"),
            reserved_until=row.get("reserved_until"),
            retry_of=row.get("retry_of"),
            retried_as=row.get("retried_as"),
            errors=error_records(row.get("errors")),
        )

    @classmethod
    def from_fields(cls, row: Sequence[Any]) -> Job:
        """Build a job from a tuple row holding its columns in the order of Job's fields
        (a statement's ``RETURNING`` in that order), extra columns after them ignored:
        a claim's hundreds of rows, without a dict and keywords per row."""
        return cls(*row[:4], STATUS_BY_VALUE[row[4]], *row[5:23])  # type: ignore[call-arg]

    def started(self, attempts: int, lease_id: uuid.UUID, started_at: datetime) -> Job:
        """Return this reserved job as its start wrote it: running, at attempt
        ``attempts``, under ``lease_id`` (built positionally: once per started job)."""
        return Job(
            self.id, self.org_id, self.type, self.queue, JobStatus.RUNNING, attempts,
            self.dedup_key, self.payload, self.progress, self.report, self.error, None,
            self.run_after, lease_id, self.worker_id, self.created_at, started_at,
            self.finished_at, self.cancel_requested_at, self.priority, self.concurrency_key,
            self.trace_context, None, self.retry_of,
        )  # fmt: skip

    @property
    def last_progress_at(self) -> datetime | None:
        """Return the handler's last sign of life while the job runs (else None)."""
        return last_progress_at(self.status, self.progress, self.started_at)

    def silence_s(self, now: datetime) -> float | None:
        """Return how long the running handler has been silent at ``now`` (else None)."""
        return silence_s(self.status, self.progress, self.started_at, now)

    @property
    def reservation(self) -> datetime | None:
        """Return when the job's reservation ends while it is queued and reserved."""
        return self.reserved_until if self.status is JobStatus.QUEUED else None

    def to_json(self) -> dict[str, Any]:
        """Return the job as a JSON-ready dict (ids and times as strings)."""
        return {
            "id": str(self.id),
            "org_id": self.org_id,
            "type": self.type,
            "queue": self.queue,
            "status": str(self.status),
            "attempts": self.attempts,
            "dedup_key": self.dedup_key,
            "priority": self.priority,
            "concurrency_key": self.concurrency_key,
            "payload": self.payload,
            "progress": self.progress,
            "report": self.report,
            "error": self.error,
            "reason": self.reason,
            "run_after": _iso(self.run_after),
            "worker_id": self.worker_id,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "reserved_until": _iso(self.reservation),
            "retry_of": str(self.retry_of) if self.retry_of else None,
            "retried_as": str(self.retried_as) if self.retried_as else None,
            "errors": [record.to_json() for record in self.errors],
        }


@dataclass(frozen=True, slots=True)
class JobEvent:
    """A row of ``jobsd.job_events``: one status change."""

    id: int
    job_id: uuid.UUID
    from_status: JobStatus | None
    to_status: JobStatus
    attempt: int
    worker_id: str | None
    reason: str | None
    at: datetime

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> JobEvent:
        """Build an event from a dict row."""
        return cls(
            id=row["id"],
            job_id=row["job_id"],
            from_status=JobStatus(row["from_status"]) if row["from_status"] else None,
            to_status=JobStatus(row["to_status"]),
            attempt=row["attempt"],
            worker_id=row["worker_id"],
            reason=row["reason"],
            at=row["at"],
        )

    def to_json(self) -> dict[str, Any]:
        """Return the event in the API's shape."""
        return {
            "from": str(self.from_status) if self.from_status else None,
            "to": str(self.to_status),
            "at": _iso(self.at),
            "attempt": self.attempt,
            "reason": self.reason,
            "worker": self.worker_id,
        }


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A declared queue: its limits, whether it is paused, and its open jobs by state.

    A limit of None is unset: no capacity, the default concurrency limit, finished
    jobs kept until deleted. The counts are every org's jobs, read in one statement.
    """

    name: str
    created_at: datetime
    paused_at: datetime | None
    capacity: int | None
    concurrency_limit: int | None
    retention_days: int | None
    queued: int
    scheduled: int
    blocked: int
    running: int
    recovery_required: int

    @property
    def paused(self) -> bool:
        """Say whether claims from this queue are stopped."""
        return self.paused_at is not None

    @property
    def depth(self) -> dict[str, int]:
        """Return the open jobs by state, in the order of ``OPEN_STATES``."""
        return {state: int(getattr(self, state)) for state in OPEN_STATES}

    @property
    def open_jobs(self) -> int:
        """Return the number of jobs not yet finished (what the capacity counts)."""
        return sum(self.depth.values())

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> QueueInfo:
        """Build from a row of ``jobsd.queue_info()``."""
        return cls(**{k: row[k] for k in cls.__slots__})

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict (times in ISO 8601), as ``jobsd queue list --json``."""
        return {
            "name": self.name,
            "paused": self.paused,
            "paused_at": _iso(self.paused_at),
            "capacity": self.capacity,
            "concurrency_limit": self.concurrency_limit,
            "retention_days": self.retention_days,
            "created_at": _iso(self.created_at),
            "depth": self.depth,
        }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as one read saw it: its row, its retry (``job.retried_as``) and its whole
    history, oldest change first."""

    job: Job
    history: list[JobEvent]


def last_progress_at(
    status: str, progress: dict[str, Any] | None, started_at: datetime | None
) -> datetime | None:
    """Return a running job's last sign of life from its handler: its last progress
    (``progress.updated_at``, written only when the handler reports progress) or, if
    later, this run's start (a re-run carries its previous run's progress). None
    unless the job runs."""
    if status != JobStatus.RUNNING or started_at is None:
        return None
    stamp = (progress or {}).get("updated_at")
    if isinstance(stamp, str):
        try:
            reported = datetime.fromisoformat(stamp)
        except ValueError:
            return started_at
        if reported.tzinfo is not None and reported > started_at:
            return reported
    return started_at


def silence_s(
    status: str, progress: dict[str, Any] | None, started_at: datetime | None, now: datetime
) -> float | None:
    """Return how long a running job's handler has been silent at ``now`` (None unless
    it runs): the time since ``last_progress_at``."""
    last = last_progress_at(status, progress, started_at)
    if last is None:
        return None
    return max((now - last).total_seconds(), 0.0)


def split_traceback(report: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str | None]:
    """Return a failure's report without its traceback (``report.error.traceback``), and
    the traceback: for front ends that show it as lines of text, not as an escaped JSON
    string. Any other report comes back as it is, with None."""
    cause = (report or {}).get("error")
    if report is None or not isinstance(cause, dict):
        return report, None
    traceback = cause.get("traceback")
    if not isinstance(traceback, str):
        return report, None
    rest = {key: value for key, value in cause.items() if key != "traceback"}
    return {**report, "error": rest}, traceback
