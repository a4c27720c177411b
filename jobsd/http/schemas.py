"""The JSON shapes of the HTTP API (request bodies, responses, errors).

Text that reaches Postgres is checked here, so the database never sees what it would
reject (a NUL character, a lone surrogate, a date outside its range or ours): such
input is a 422, never a 500.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self, cast

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from jobsd.jobspec import EnqueueOptions
from jobsd.models import QUEUE_NAME_PATTERN, Job, JobStatus, JobView, last_progress_at, silence_s

__all__ = [
    "QUEUE_PATTERN",
    "CursorText",
    "ErrorOut",
    "ErrorRecordOut",
    "HealthReport",
    "HistoryItem",
    "JobDetail",
    "JobFilters",
    "JobIn",
    "JobOut",
    "JobPage",
    "JobSummary",
    "Liveness",
    "OrgFilter",
    "Problem",
    "QueueFilter",
    "Readiness",
    "TypeFilter",
    "check_job_filters",
    "pg_text",
]

# the CHECK constraint of jobsd.queues.name
QUEUE_PATTERN = QUEUE_NAME_PATTERN


def pg_text(value: str) -> str:
    """Refuse text Postgres cannot store: the NUL character and lone surrogates."""
    if "\x00" in value:
        raise ValueError("must not contain the NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return value


JobType = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(pg_text)]
DedupKey = Annotated[str, StringConstraints(min_length=1, max_length=512), AfterValidator(pg_text)]
QueueName = Annotated[str, StringConstraints(pattern=QUEUE_PATTERN)]
ConcurrencyKey = Annotated[
    str, StringConstraints(min_length=1, max_length=255), AfterValidator(pg_text)
]

# The filters of a jobs list, for the API (GET /jobs) and the dashboard (/ui/jobs):
# text that could reach Postgres is refused first (NUL, lone surrogates), and so is
# what no job can match (a type over 200 characters, a queue name of the wrong shape).
TypeFilter = Annotated[str, StringConstraints(max_length=200), AfterValidator(pg_text)]
QueueFilter = Annotated[str, StringConstraints(pattern=QUEUE_PATTERN)]
OrgFilter = Annotated[str, StringConstraints(max_length=255), AfterValidator(pg_text)]
CursorText = Annotated[str, StringConstraints(max_length=200)]


class JobFilters(BaseModel):
    """The filters of a jobs list, checked once for every front end; None means any."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: JobStatus | None = None
    type: TypeFilter | None = None
    queue: QueueFilter | None = None
    org_id: OrgFilter | None = None
    """An admin's choice of org; an org's own list is its token's org."""
    cursor: CursorText | None = None
    """``next_cursor`` of the previous page, still to decode."""


def check_job_filters(
    *,
    status: str | None = None,
    type: str | None = None,
    queue: str | None = None,
    org_id: str | None = None,
    cursor: str | None = None,
) -> JobFilters:
    """Check a jobs list's filters as given in a query (empty text means any).

    Raises ValueError naming the first bad filter, e.g. ``type: must not contain the
    NUL character``.
    """
    given = {"status": status, "type": type, "queue": queue, "org_id": org_id, "cursor": cursor}
    try:
        return JobFilters.model_validate({k: v for k, v in given.items() if v})
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        field = str(first["loc"][0]) if first["loc"] else "filter"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ValueError(f"{field}: {message}") from None


class JobIn(BaseModel):
    """A job to submit."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"type": "import_csv", "payload": {"file": "a.csv"}},
                {
                    "type": "map_reconcile",
                    "payload": {"target_id": 3},
                    "queue": "default",
                    "dedup_key": "map_reconcile:3",
                    "id": "01970f3a-1c2b-7d4e-8f00-123456789abc",
                },
            ]
        },
    )

    type: JobType = Field(description="The job type; a handler of the daemon runs it.")
    payload: dict[str, Any] = Field(
        default_factory=dict, description="The job's arguments: a JSON object."
    )
    queue: QueueName = Field(default="default", description="A declared queue.")
    dedup_key: DedupKey | None = Field(
        default=None,
        description="At most one pending job per org holds a key; a second submission "
        "with the same key returns the first job.",
    )
    run_after: AwareDatetime | None = Field(
        default=None, description="Not before this time (with a time zone)."
    )
    id: uuid.UUID | None = Field(
        default=None,
        description="A client-chosen job id (UUIDv7 recommended): a retried submission "
        "with the same id returns the same job, never a second one.",
    )
    priority: int = Field(
        default=0,
        ge=-1_000_000,
        le=1_000_000,
        description="Lower runs first; first in, first out within a priority.",
    )
    concurrency_key: ConcurrencyKey | None = Field(
        default=None,
        description="Jobs of the org sharing this key run at most the key's limit at once "
        "(the type's, else the queue's concurrency limit, else 1).",
    )
    depends_on: list[uuid.UUID] = Field(
        default_factory=list,
        max_length=1000,
        description="Jobs of the org that must all succeed first: the job is blocked "
        "until then, and fails with reason 'dependency <id> <state>' if one fails or is "
        "cancelled.",
    )

    def options(self, job_id: uuid.UUID) -> EnqueueOptions:
        """Return the enqueue options of this submission, with its job id (fixed by now)."""
        given = self.model_dump(include=set(EnqueueOptions.__optional_keys__) - {"job_id"})
        return cast(EnqueueOptions, {**given, "job_id": job_id})

    @field_validator("run_after")
    @classmethod
    def _run_after_in_range(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        try:
            year = value.astimezone(UTC).year
        except OverflowError:
            raise ValueError("run_after is out of range") from None
        if not 1970 <= year <= 9998:
            raise ValueError("run_after must be between the years 1970 and 9998")
        return value


class HistoryItem(BaseModel):
    """One status change of a job."""

    model_config = ConfigDict(populate_by_name=True)

    from_: JobStatus | None = Field(alias="from", description="None for the creation.")
    to: JobStatus
    at: datetime = Field(description="The database's clock.")
    attempt: int
    reason: str | None
    worker: str | None = Field(description="Who made the change (a worker id, or 'api').")


# fields of a job's answer computed from the others when it is built
_COMPUTED = frozenset({"last_progress_at", "silence_s"})


class JobSummary(BaseModel):
    """A job as listed: everything but its payload and report."""

    id: uuid.UUID
    org_id: str
    type: str
    queue: str
    status: JobStatus
    attempts: int
    dedup_key: str | None
    priority: int = 0
    concurrency_key: str | None = None
    progress: dict[str, Any] | None
    error: str | None = Field(description="Why the job failed (at most 2 KiB).")
    reason: str | None = Field(description="Why the job is in its current status.")
    run_after: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    reserved_until: datetime | None = Field(
        default=None,
        description="Set while the job is queued and reserved by a daemon ahead of its "
        "free slots: that daemon starts it when a slot frees; after this time any "
        "daemon may claim it. A reservation charges no attempt.",
    )

    retry_of: uuid.UUID | None = Field(
        default=None, description="The failed or cancelled job this job retries."
    )
    retried_as: uuid.UUID | None = Field(
        default=None,
        description="The job that retries this one, once it was retried (this job stays "
        "as it ended).",
    )

    last_progress_at: datetime | None = Field(
        default=None,
        description="Set while the job runs: when its handler last reported progress "
        "(or started, if it has not since). The daemon's own liveness is not in it.",
    )
    silence_s: float | None = Field(
        default=None,
        description="Set while the job runs: seconds since last_progress_at, when this "
        "answer was made. A handler silent past its type's stall_after is ended.",
    )

    @model_validator(mode="after")
    def _while_queued_or_running(self) -> JobSummary:
        # a job cancelled while reserved keeps the column; it is no reservation then
        if self.status is not JobStatus.QUEUED:
            self.reserved_until = None
        self.last_progress_at = last_progress_at(self.status, self.progress, self.started_at)
        self.silence_s = silence_s(self.status, self.progress, self.started_at, datetime.now(UTC))
        if self.silence_s is not None:
            self.silence_s = round(self.silence_s, 3)
        return self

    @classmethod
    def from_job(cls, job: Job) -> Self:
        """Build from a ``Job``."""
        return cls.model_validate(
            {k: getattr(job, k) for k in cls.model_fields if k not in _COMPUTED}
        )


class JobOut(JobSummary):
    """A job, with its payload and report."""

    payload: dict[str, Any]
    report: dict[str, Any] | None = Field(
        description="The handler's result; on failure also the error type, full message "
        "and traceback."
    )


class ErrorRecordOut(BaseModel):
    """One attempt that ended in an error."""

    attempt: int = Field(description="The attempt that ended.")
    at: datetime = Field(description="When its end was written (the database's clock).")
    type: str | None = Field(
        description="The exception's class, module.Qualname; null when none was raised "
        "(a timeout, a stall, a crashed handler process, a lost worker)."
    )
    message: str = Field(description="The error (at most 2 KiB).")
    traceback: str | None = Field(
        description="The handler's traceback, at most 16 KiB: a longer one keeps its end, "
        "after a first line that says how many bytes were cut."
    )
    cause: str = Field(
        description="Why the attempt ended, in the words of reason: handler error, timeout, "
        "stalled, handler crashed, memory limit, worker lost, shutdown... (a retried "
        "attempt's job says reason retry; its record says why)."
    )


class JobDetail(JobOut):
    """A job with its history, oldest change first."""

    history: list[HistoryItem]
    errors: list[ErrorRecordOut] = Field(
        description="The last attempts that ended in an error (at most 10), most recent "
        "first; error, reason and report say the last attempt's alone.",
    )

    @classmethod
    def from_view(cls, view: JobView) -> JobDetail:
        """Build from a job read with its history."""
        job = view.job
        fields = {k: getattr(job, k) for k in JobOut.model_fields if k not in _COMPUTED}
        errors = [ErrorRecordOut.model_validate(r, from_attributes=True) for r in job.errors]
        history = [
            HistoryItem.model_validate(
                {
                    "from": e.from_status,
                    "to": e.to_status,
                    "at": e.at,
                    "attempt": e.attempt,
                    "reason": e.reason,
                    "worker": e.worker_id,
                }
            )
            for e in view.history
        ]
        return cls.model_validate({**fields, "history": history, "errors": errors})


class ResolveIn(BaseModel):
    """How a job awaiting recovery is settled."""

    model_config = ConfigDict(extra="forbid")

    outcome: Literal["succeeded", "failed", "requeue"] = Field(
        description="succeeded: the work was done; failed: it was not; requeue: run it again."
    )


class JobPage(BaseModel):
    """One page of the org's jobs, newest first."""

    jobs: list[JobSummary]
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next page; null on the last page."
    )


class Problem(BaseModel):
    """What went wrong, for programs (code) and people (message)."""

    code: str = Field(description="A stable identifier, e.g. job_not_found.")
    message: str
    job_id: uuid.UUID | None = Field(
        default=None, description="With outcome_unknown: retry with this id."
    )
    retry_after_s: int | None = Field(
        default=None, description="With rate_limited: seconds until a submission will be accepted."
    )
    correlation_id: str | None = Field(
        default=None,
        description="Ties the answer to the server's log line, which has the full detail "
        "(the answer never carries the database's own text).",
    )


class ErrorOut(BaseModel):
    """An error answer."""

    detail: Problem


class Liveness(BaseModel):
    """The process answers and its event loop is not stalled."""

    status: Literal["ok", "stalled"]
    loop_lag_s: float = Field(description="Worst event-loop lag over the last minute.")
    last_tick_age_s: float = Field(description="Time since the loop monitor last ran.")


class Readiness(BaseModel):
    """The database is reachable and the LISTEN connections are up."""

    status: Literal["ready", "unavailable"]
    checks: dict[str, bool]


class HealthReport(BaseModel):
    """Early warnings about the jobs table and the wake-up path."""

    status: Literal["ok", "warn", "unavailable"]
    warnings: list[str]
    database: bool = Field(description="The report's queries ran.")
    oldest_queued_age_s: float | None = Field(
        description="Pickup lag: the longest wait among the next jobs to be claimed."
    )
    live_tuples: int | None
    dead_tuples: int | None = Field(description="Dead tuples on jobsd.jobs.")
    last_vacuum_at: datetime | None
    oldest_xact_age_s: float | None = Field(
        description="Age of the oldest open transaction in this database (holds back vacuum)."
    )
    oldest_prepared_xact_age_s: float | None
    notify_queue_usage: float | None = Field(
        default=None,
        description="Share of the cluster's NOTIFY queue in use (0 to 1); a listener left "
        "in an open transaction fills it, and at 1 enqueues that notify fail.",
    )
    last_notify_age_s: float | None = Field(
        description="Time since the attached daemon last received a NOTIFY (null: none yet, "
        "or no daemon attached)."
    )
    last_done_notify_age_s: float | None = Field(
        description="Time since this API last received a job-finished notification."
    )
    listen_connected: bool = Field(description="This API's LISTEN connection is up.")
    unhandled_jobs: int | None = Field(
        default=None,
        description="Queued jobs of types that no live daemon handles (every org's): they "
        "wait until a daemon with their handler starts.",
    )
    unhandled_types: dict[str, int] = Field(default_factory=dict, description="Those jobs by type.")
    oldest_running_age_s: float | None = Field(
        default=None, description="Age of the oldest running job (null: none runs)."
    )
    oldest_running_idle_s: float | None = Field(
        default=None,
        description="The longest silence of a running job: the time since its handler "
        "last reported progress (or started, if it has not since). The daemon's own "
        "liveness is its lease, not in it.",
    )
    recovery_required: int | None = Field(
        default=None,
        description="Jobs whose outcome is unknown, waiting for an operator (jobsd resolve).",
    )
    slots: int | None = Field(description="The attached daemon's slots.")
    slots_busy: int | None
