"""The exception tree of jobsd.

Every error jobsd raises on purpose derives from ``JobsdError``. Database errors keep the
psycopg exception as ``__cause__``; their message names the operation and the id.
"""

from __future__ import annotations

__all__ = [
    "AlreadyClaimed",
    "BackendUnavailable",
    "CancelRefused",
    "ConfigError",
    "DatabaseError",
    "DuplicateJob",
    "Forbidden",
    "InvalidPayload",
    "JobNotFound",
    "JobsdError",
    "MigrationError",
    "OrgQuotaExceeded",
    "OutcomeUnknown",
    "PayloadMismatch",
    "PayloadTooLarge",
    "QueueExists",
    "QueueFull",
    "QueueNotEmpty",
    "ResolveRefused",
    "RetryRefused",
    "TransientConflict",
    "UnknownDependency",
    "UnknownQueue",
    "UnknownSchedule",
]


class JobsdError(Exception):
    """Base class of every error jobsd raises on purpose."""


class ConfigError(JobsdError):
    """The configuration is missing something or contradicts itself."""


class MigrationError(JobsdError):
    """A schema migration failed or the schema is in an unexpected state."""


class InvalidPayload(JobsdError, ValueError):
    """A payload or report cannot be stored: not JSON, too large, or rejected by Postgres."""


class PayloadTooLarge(InvalidPayload):
    """A payload is larger than the configured cap."""


class PayloadMismatch(InvalidPayload):
    """A payload does not validate against its type's pydantic model (a typed handler's).

    Raised at enqueue, before any SQL; raised in the daemon before the handler runs,
    where it fails the job without a retry: the same payload cannot do better.
    ``errors`` holds pydantic's errors, without the input values.
    """

    def __init__(
        self, message: str, *, type: str = "", errors: list[dict[str, object]] | None = None
    ) -> None:
        super().__init__(message)
        self.type = type
        self.errors = errors or []


class UnknownQueue(JobsdError, LookupError):
    """The queue named in an enqueue has not been declared."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"unknown queue {queue!r}: declare it first")
        self.queue = queue


class UnknownSchedule(JobsdError, LookupError):
    """No schedule has this id (schedules are declared by the daemons that run them)."""

    def __init__(self, schedule_id: str) -> None:
        super().__init__(f"unknown schedule {schedule_id!r}")
        self.schedule_id = schedule_id


class JobNotFound(JobsdError, LookupError):
    """No job with this id is visible."""

    def __init__(self, job_id: object) -> None:
        super().__init__(f"job {job_id} not found")
        self.job_id = job_id


class DatabaseError(JobsdError):
    """A database operation failed; the psycopg error is the ``__cause__``."""


class BackendUnavailable(DatabaseError):
    """The database cannot be reached; the operation did not take place."""


class NoWritableServer(BackendUnavailable):
    """Every server jobsd reached is read-only (a standby, or one not yet promoted).

    The daemon waits for a primary (during a failover one appears within seconds);
    commands and the daemon's start refuse with this error.
    """


class OutcomeUnknown(BackendUnavailable):
    """The connection dropped during a commit and jobsd could not tell whether it happened.

    Retry with the same job id: a job id can only ever create one job.
    """


class TransientConflict(BackendUnavailable):
    """A deadlock or a serialization failure aborted the statement: nothing was done.

    Retrying is safe (the daemon does; ``Client.enqueue`` does with the same job id).
    In a caller's transaction the transaction is aborted: roll back and retry it.
    """


class DuplicateJob(DatabaseError):
    """A job id is already taken by a job that is not visible to this caller."""


class AlreadyClaimed(DatabaseError):
    """Another worker holds the job that this worker tried to claim."""


class QueueFull(JobsdError):
    """The queue holds ``capacity`` open jobs already: the enqueue was refused, nothing inserted."""

    def __init__(self, queue: str, capacity: int | None = None) -> None:
        limit = f" (capacity {capacity})" if capacity is not None else ""
        super().__init__(f"queue {queue!r} is full{limit}: retry later or raise its capacity")
        self.queue = queue
        self.capacity = capacity


class OrgQuotaExceeded(QueueFull):
    """The org holds its ``org_open_limit`` of open jobs in the queue: nothing inserted.

    A QueueFull of one org: other orgs may still enqueue into the queue.
    """

    def __init__(self, queue: str, limit: int | None = None) -> None:
        JobsdError.__init__(
            self,
            f"this org holds its quota of open jobs in queue {queue!r}"
            + (f" ({limit})" if limit is not None else "")
            + ": retry once some of them finished",
        )
        self.queue = queue
        self.capacity = limit


class UnknownDependency(JobsdError, LookupError):
    """A job named in ``depends_on`` does not exist (or belongs to another org)."""

    def __init__(self, job_ids: list[str]) -> None:
        super().__init__(f"unknown dependency: no job {', '.join(job_ids)}")
        self.job_ids = job_ids


class QueueExists(JobsdError):
    """A queue of that name is declared already: nothing was changed."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"queue {queue!r} exists already")
        self.queue = queue


class QueueNotEmpty(JobsdError):
    """The queue still holds ``open_jobs`` unfinished jobs: it was not dropped, nothing deleted."""

    def __init__(self, queue: str, open_jobs: int) -> None:
        jobs = "job" if open_jobs == 1 else "jobs"
        super().__init__(
            f"queue {queue!r} holds {open_jobs} open {jobs} (queued, scheduled, blocked, "
            "running or recovery_required): nothing was dropped; let them finish or cancel them"
        )
        self.queue = queue
        self.open_jobs = open_jobs


class Forbidden(JobsdError, PermissionError):
    """The caller may not do this (``act``): it takes an operator (an admin token of no
    org, or the database's own URL). Nothing was done."""

    def __init__(self, act: str) -> None:
        super().__init__(
            f"only an operator may {act}: use an operator token, made by "
            "`jobsd token create --admin`"
        )
        self.act = act


class CancelRefused(JobsdError):
    """A cancel was refused: nothing changed. ``why`` is ``finished`` (the job
    succeeded or failed), ``recovery_required`` (it awaits an operator's decision:
    resolve it) or ``changed`` (it changed state while the cancel looked: try again)."""

    def __init__(self, job_id: object, why: str, status: str) -> None:
        messages = {
            "finished": f"it has already {status}",
            "recovery_required": "it awaits an operator's decision (resolve it), not a cancel",
            "changed": "it changed state meanwhile: try again",
        }
        super().__init__(f"cancel of job {job_id} refused: {messages.get(why, why)}")
        self.job_id = job_id
        self.why = why
        self.status = status


class ResolveRefused(JobsdError):
    """A resolve was refused: the job is not ``recovery_required``; nothing changed."""

    def __init__(self, job_id: object, status: str) -> None:
        super().__init__(f"resolve of job {job_id} refused: it is {status}, not recovery_required")
        self.job_id = job_id
        self.status = status


class RetryRefused(JobsdError):
    """A retry was refused: nothing changed. ``why`` is ``not_ended`` (the job is not
    failed or cancelled), ``at_most_once`` (its type may not run twice; force it) or
    ``dependency`` (a job it depends on has not succeeded)."""

    def __init__(self, job_id: object, why: str, status: str | None = None) -> None:
        messages = {
            "not_ended": f"it is {status}: only a failed or cancelled job can be retried",
            "at_most_once": "its type is at_most_once, a new run may repeat what the last "
            "one did: retry with force (--force) if that is safe",
            "dependency": "a job it depends on has not succeeded: retry that one first",
        }
        super().__init__(f"retry of job {job_id} refused: {messages.get(why, why)}")
        self.job_id = job_id
        self.why = why
        self.status = status
