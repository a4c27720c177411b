"""The statements of the operations on jobs: read one with its history, list, cancel,
retry, resolve, wait.

``jobsd.ops`` decides (who may, what an outcome means); each function here runs its
statements and returns what the database said. ``org_id`` limits a call to one org
and sets it for row-level security (the API's role); None is any org (operators).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict, Unpack

from psycopg import sql

from jobsd.errors import DatabaseError, JobNotFound
from jobsd.models import Job, JobEvent, JobStatus, JobView
from jobsd.store.api import Cursor, done_notify_key, done_payload, run_for_org, run_for_org_sync
from jobsd.store.connect import connect, connect_async
from jobsd.store.db import AsyncConn, SyncConn, db_errors
from jobsd.store.named import Row, run_named_sync

__all__ = [
    "CancelAnswer",
    "Cursor",
    "JobPage",
    "ListOptions",
    "RetryAnswer",
    "RetryArgs",
    "cancel",
    "cancel_sync",
    "check_list_options",
    "get_view",
    "get_view_sync",
    "list_jobs",
    "list_jobs_sync",
    "resolve",
    "retry",
    "retry_sync",
    "status_of",
    "wait_job",
    "wait_job_sync",
]

# migration 0002: the job id is notified on this channel when a job ends
DONE_CHANNEL = "jobsd_done"

MAX_PAGE = 1000
_LAST_ID = uuid.UUID(int=(1 << 128) - 1)


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of jobs, newest first; ``next`` is the cursor of the next page (None:
    this was the last)."""

    jobs: list[Job]
    next: Cursor | None


class ListOptions(TypedDict, total=False):
    """The filters and the page of a job listing, all optional."""

    status: JobStatus | str | None
    """Only jobs in this state."""
    type: str | None
    """Only jobs of this type."""
    queue: str | None
    """Only jobs of this queue."""
    org_id: str | None
    """Only this org's jobs (it is set for row-level security); None: every org."""
    since: datetime | None
    """Only jobs created at or after it (timezone-aware)."""
    after: Cursor | None
    """The ``next`` of the previous page."""
    limit: int
    """At most this many jobs (1..1000; 50)."""


def _list_params(
    *,
    status: JobStatus | str | None = None,
    type: str | None = None,
    queue: str | None = None,
    org_id: str | None = None,
    since: datetime | None = None,
    after: Cursor | None = None,
    limit: int = 50,
) -> tuple[dict[str, Any], int]:
    """Check a listing's options (ValueError); return ``jobs_list``'s parameters and the
    page size. An unknown option is a TypeError, as for a plain signature."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, not {limit}")
    if status is not None:
        try:
            status = JobStatus(status)
        except ValueError:
            states = ", ".join(s.value for s in JobStatus)
            raise ValueError(f"unknown status {status!r}: one of {states}") from None
    if since is not None and since.tzinfo is None:
        raise ValueError("since must carry a time zone (e.g. 2030-01-01T00:00:00Z)")
    params = {
        "org_id": org_id,
        "before_created_at": after.created_at if after else "infinity",
        "before_id": after.id if after else _LAST_ID,
        "since": since,
        "status": str(status) if status is not None else None,
        "type": type,
        "queue": queue,
        # one more than asked: whether a next page exists, without a count
        "limit": limit + 1,
    }
    return params, limit


def check_list_options(**options: Unpack[ListOptions]) -> None:
    """Raise ValueError for a listing's bad option, as ``list_jobs`` would."""
    _list_params(**options)


def _list_statement(options: ListOptions) -> str:
    """One org's listing reads that org's index backwards; every org's, the jobs."""
    return "jobs_list" if options.get("org_id") is None else "api_jobs_list"


def _page(rows: list[Row], limit: int) -> JobPage:
    jobs = [Job.from_row(r) for r in rows[:limit]]
    more = len(rows) > limit
    return JobPage(jobs, Cursor(jobs[-1].created_at, jobs[-1].id) if more else None)


async def list_jobs(conn: AsyncConn, **options: Unpack[ListOptions]) -> JobPage:
    """List jobs newest first, ``limit`` at most, older than the cursor ``after``.

    ``since`` keeps jobs created at or after it. Raises ValueError for an unknown
    status, a naive ``since`` or a limit outside 1..1000.
    """
    params, limit = _list_params(**options)
    with db_errors("listing of jobs"):
        rows = await run_for_org(conn, options.get("org_id"), _list_statement(options), params)
    return _page(rows, limit)


def list_jobs_sync(conn: SyncConn, **options: Unpack[ListOptions]) -> JobPage:
    """List jobs; see ``list_jobs`` (sync)."""
    params, limit = _list_params(**options)
    with db_errors("listing of jobs"):
        rows = run_for_org_sync(conn, options.get("org_id"), _list_statement(options), params)
    return _page(rows, limit)


def _view(rows: list[Row]) -> JobView | None:
    """Build a job and its history from a row of ``api_jobs_get``, or None."""
    if not rows:
        return None
    row = rows[0]
    names = ("h_id", "h_from", "h_to", "h_attempt", "h_worker", "h_reason", "h_at")
    columns = [row[n] or [] for n in names]
    job = Job.from_row(row)
    history = [
        JobEvent(
            id=i,
            job_id=job.id,
            from_status=JobStatus(f) if f else None,
            to_status=JobStatus(t),
            attempt=a,
            worker_id=w,
            reason=r,
            at=at,
        )
        for i, f, t, a, w, r, at in zip(*columns, strict=True)
    ]
    return JobView(job, history)


async def get_view(conn: AsyncConn, job_id: uuid.UUID, org_id: str | None) -> JobView | None:
    """Read a job with its history and its retry, in one statement; None when there is
    none (of ``org_id``)."""
    params = {"id": job_id, "org_id": org_id}
    with db_errors(f"read of job {job_id}"):
        return _view(await run_for_org(conn, org_id, "api_jobs_get", params))


def get_view_sync(conn: SyncConn, job_id: uuid.UUID, org_id: str | None) -> JobView | None:
    """Read a job with its history; see ``get_view`` (sync)."""
    params = {"id": job_id, "org_id": org_id}
    with db_errors(f"read of job {job_id}"):
        return _view(run_for_org_sync(conn, org_id, "api_jobs_get", params))


async def status_of(conn: AsyncConn, job_id: uuid.UUID, org_id: str | None) -> JobStatus | None:
    """Read only the status of a job (of ``org_id``), or None: a long-poll's re-read."""
    params = {"id": job_id, "org_id": org_id}
    with db_errors(f"read of the status of job {job_id}"):
        rows = await run_for_org(conn, org_id, "api_jobs_status", params)
    return JobStatus(rows[0]["status"]) if rows else None


@dataclass(frozen=True, slots=True)
class RetryAnswer:
    """What ``jobsd.job_retry`` said: ``outcome`` (retried, already_retried, not_found,
    not_ended, at_most_once, dependency) and the job it concerns, read back."""

    outcome: str
    job: Job | None
    status: JobStatus | None
    """the retried job's status, for a refusal's message"""


class RetryArgs(TypedDict):
    """Who retries a job as which new job: ``new_id``, ``actor``, ``force``, ``org_id``."""

    new_id: uuid.UUID
    actor: str
    force: bool
    org_id: str | None


def _retry_read(
    job_id: uuid.UUID, rows: list[Row], org_id: str | None
) -> tuple[str, Any, dict[str, Any]]:
    """Return the outcome of ``jobs_retry``, the job it made, and the parameters of the
    read of the job it names (the new one, else the retried one)."""
    outcome, made = str(rows[0]["outcome"]), rows[0]["job_id"]
    return outcome, made, {"id": made if made is not None else job_id, "org_id": org_id}


async def retry(conn: AsyncConn, job_id: uuid.UUID, **args: Unpack[RetryArgs]) -> RetryAnswer:
    """Retry a failed or cancelled job as the new job ``new_id``, in one transaction with
    the read of the job it names. A full queue or org quota raises QueueFull or
    OrgQuotaExceeded, and nothing is written."""
    org_id = args["org_id"]
    with db_errors(f"retry of job {job_id}"):
        async with conn.transaction():
            rows = await run_for_org(conn, org_id, "jobs_retry", {"id": job_id, **args})
            outcome, made, read = _retry_read(job_id, rows, org_id)
            found = await run_for_org(conn, org_id, "jobs_get_in_org", read)
    return _retry_answer(outcome, made, found)


def retry_sync(conn: SyncConn, job_id: uuid.UUID, **args: Unpack[RetryArgs]) -> RetryAnswer:
    """Retry a failed or cancelled job as a new job; see ``retry`` (sync)."""
    org_id = args["org_id"]
    with db_errors(f"retry of job {job_id}"), conn.transaction():
        rows = run_for_org_sync(conn, org_id, "jobs_retry", {"id": job_id, **args})
        outcome, made, read = _retry_read(job_id, rows, org_id)
        found = run_for_org_sync(conn, org_id, "jobs_get_in_org", read)
    return _retry_answer(outcome, made, found)


def _retry_answer(outcome: str, made: uuid.UUID | None, found: list[Row]) -> RetryAnswer:
    job = Job.from_row(found[0]) if found else None
    if made is not None:
        return RetryAnswer(outcome, job, None)
    return RetryAnswer(outcome, None, job.status if job else None)


@dataclass(frozen=True, slots=True)
class CancelAnswer:
    """What ``jobs_cancel`` did: ``previous`` is the status it changed (queued,
    scheduled, blocked: now cancelled; running: a request recorded), None when it
    changed nothing; ``job`` is the job as it is now (None: no such job)."""

    previous: JobStatus | None
    job: Job | None
    changed: bool = False
    """False when it changed nothing, or the running job's cancel was requested before"""


def _cancelled(row: Row) -> CancelAnswer:
    return CancelAnswer(JobStatus(row["previous"]), Job.from_row(row), bool(row["changed"]))


async def cancel(
    conn: AsyncConn, job_id: uuid.UUID, *, actor: str, reason: str, org_id: str | None
) -> CancelAnswer:
    """Cancel a job that has not started, or record a request to cancel a running one.

    Idempotent: a repeated request keeps the first request's time. The actor, the org
    and ``jobs_cancel`` go in one round trip; only when it changed nothing is the job
    read back.
    """
    params = {"id": job_id, "org_id": org_id, "reason": reason}
    actor_set = ("admin_set_actor", {"worker_id": actor})
    with db_errors(f"cancel of job {job_id}"):
        rows = await run_for_org(conn, org_id, "jobs_cancel", params, before=[actor_set])
        if rows:
            return _cancelled(rows[0])
        rows = await run_for_org(conn, org_id, "jobs_get_in_org", {"id": job_id, "org_id": org_id})
    return CancelAnswer(None, Job.from_row(rows[0]) if rows else None)


def cancel_sync(
    conn: SyncConn, job_id: uuid.UUID, *, actor: str, reason: str, org_id: str | None
) -> CancelAnswer:
    """Cancel a job or request its cancel; see ``cancel`` (sync)."""
    params = {"id": job_id, "org_id": org_id, "reason": reason}
    with db_errors(f"cancel of job {job_id}"):
        with conn.transaction():
            if org_id is not None:
                run_named_sync(conn, "api_set_org", {"org_id": org_id})
            run_named_sync(conn, "admin_set_actor", {"worker_id": actor})
            rows = run_named_sync(conn, "jobs_cancel", params)
        if rows:
            return _cancelled(rows[0])
        rows = run_for_org_sync(conn, org_id, "jobs_get_in_org", {"id": job_id, "org_id": org_id})
    return CancelAnswer(None, Job.from_row(rows[0]) if rows else None)


async def resolve(
    conn: AsyncConn,
    job_id: uuid.UUID,
    *,
    status: JobStatus,
    reason: str,
    actor: str,
    error: str | None,
    org_id: str | None,
) -> tuple[Job | None, Job | None]:
    """Settle a ``recovery_required`` job as ``status`` (succeeded, failed, queued).

    Returns the job as written (None: it was not recovery_required) and the job as it
    is now (None: there is no such job of ``org_id``), from one transaction.
    """
    params = {
        "id": job_id,
        "org_id": org_id,
        "status": str(status),
        "reason": reason,
        "report": None,
        "error": error,
    }
    with db_errors(f"resolve of job {job_id}"):
        async with conn.transaction():
            actor_set = ("admin_set_actor", {"worker_id": actor})
            rows = await run_for_org(conn, org_id, "jobs_resolve", params, before=[actor_set])
            now = await run_for_org(
                conn, org_id, "jobs_get_in_org", {"id": job_id, "org_id": org_id}
            )
    written = Job.from_row(rows[0]) if rows else None
    return written, Job.from_row(now[0]) if now else None


def _deadline(timeout_s: float | None) -> float | None:
    if timeout_s is not None and timeout_s < 0:
        raise ValueError(f"timeout must be >= 0 seconds, not {timeout_s}")
    return None if timeout_s is None else time.monotonic() + timeout_s


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def _visible(job_id: uuid.UUID, rows: list[Row], org_id: str | None) -> Job:
    job = Job.from_row(rows[0]) if rows else None
    if job is None or (org_id is not None and job.org_id != org_id):
        raise JobNotFound(job_id)
    return job


async def _expected_payload(conn: AsyncConn, job_id: uuid.UUID) -> str | None:
    """Return the done-notification payload of ``job_id`` (``md5(key || id)``, migration
    0012), or None for a role that may not read the key: then every notification wakes
    a re-read of the job."""
    try:
        return done_payload(await done_notify_key(conn), job_id)
    except DatabaseError:
        return None


def _expected_payload_sync(conn: SyncConn, job_id: uuid.UUID) -> str | None:
    """Return the done-notification payload of ``job_id``; see ``_expected_payload``."""
    try:
        with db_errors("read of the done-notification key"):
            rows = run_named_sync(conn, "api_done_notify_key", {})
    except DatabaseError:
        return None
    return done_payload(str(rows[0]["key"]), job_id)


async def wait_job(
    url: str, job_id: uuid.UUID, *, timeout_s: float | None = None, org_id: str | None = None
) -> Job:
    """Wait until a job ends (or ``timeout_s`` passes: None is forever); return it as it is.

    One dedicated connection: ``LISTEN jobsd_done`` first, then the job is read, then
    each notification naming it wakes a re-read, so an end between the two is not
    missed and nothing polls. Raises JobNotFound, BackendUnavailable.
    """
    operation = f"wait for job {job_id}"
    deadline = _deadline(timeout_s)
    params = {"id": job_id}
    async with connect_async(
        url, application_name="jobsd-client-wait", operation=operation
    ) as conn:
        with db_errors(operation):
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(DONE_CHANNEL)))
            expected = await _expected_payload(conn, job_id)
            job = _visible(job_id, await run_for_org(conn, org_id, "jobs_get", params), org_id)
            while not job.status.terminal:
                left = _left(deadline)
                if left == 0.0:
                    break
                async for note in conn.notifies(timeout=left):
                    if expected is None or note.payload == expected:
                        break
                job = _visible(job_id, await run_for_org(conn, org_id, "jobs_get", params), org_id)
    return job


def wait_job_sync(
    url: str, job_id: uuid.UUID, *, timeout_s: float | None = None, org_id: str | None = None
) -> Job:
    """Wait until a job ends, or ``timeout_s``; see ``wait_job`` (sync)."""
    operation = f"wait for job {job_id}"
    deadline = _deadline(timeout_s)
    params = {"id": job_id}
    with (
        connect(url, application_name="jobsd-client-wait", operation=operation) as conn,
        db_errors(operation),
    ):
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(DONE_CHANNEL)))
        expected = _expected_payload_sync(conn, job_id)
        job = _visible(job_id, run_for_org_sync(conn, org_id, "jobs_get", params), org_id)
        while not job.status.terminal:
            left = _left(deadline)
            if left == 0.0:
                break
            for note in conn.notifies(timeout=left):
                if expected is None or note.payload == expected:
                    break
            job = _visible(job_id, run_for_org_sync(conn, org_id, "jobs_get", params), org_id)
    return job
