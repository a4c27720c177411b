"""The operations on jobs that every front end shares: list, cancel, retry.

One typed function per operation, called by the client (``Client``, ``SyncClient``),
the CLI, the HTTP API and the dashboard, so the rules live in one place: the retry
itself is the SQL function ``jobsd.job_retry`` (migration 0014), the cancel is
``jobs_cancel`` (``store.queries.cancel_job``). ``org_id`` limits a call to one org
and sets it for row-level security (the API); None is any org (operators).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict, Unpack

from psycopg import sql

from jobsd.errors import DatabaseError, JobNotFound, RetryRefused
from jobsd.models import Job, JobStatus
from jobsd.store.api import Cursor, done_notify_key, done_payload, run_for_org
from jobsd.store.connect import connect, connect_async
from jobsd.store.db import AsyncConn, SyncConn, db_errors
from jobsd.store.named import Row, run_named_sync
from jobsd.store.queries import CancelOutcome, cancel_job, cancel_outcome, cancel_unchanged

__all__ = [
    "CancelOutcome",
    "Cursor",
    "JobPage",
    "ListOptions",
    "cancel_job",
    "cancel_job_sync",
    "list_jobs",
    "list_jobs_sync",
    "retry_job",
    "retry_job_sync",
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
        rows = await run_for_org(conn, options.get("org_id"), "jobs_list", params)
    return _page(rows, limit)


def list_jobs_sync(conn: SyncConn, **options: Unpack[ListOptions]) -> JobPage:
    """List jobs; see ``list_jobs`` (sync)."""
    params, limit = _list_params(**options)
    with db_errors("listing of jobs"):
        rows = _run_for_org_sync(conn, options.get("org_id"), "jobs_list", params)
    return _page(rows, limit)


def _run_for_org_sync(
    conn: SyncConn, org_id: str | None, name: str, params: dict[str, Any]
) -> list[Row]:
    """Run a named statement with ``jobsd.org_id`` set, in one transaction (sync)."""
    if org_id is not None and not org_id:
        raise ValueError("org must be a non-empty string")
    with conn.transaction():
        if org_id is not None:
            run_named_sync(conn, "api_set_org", {"org_id": org_id})
        return run_named_sync(conn, name, params)


def _retry_params(job_id: uuid.UUID, actor: str, force: bool, org_id: str | None) -> dict[str, Any]:
    if not actor:
        raise ValueError("a retry needs an actor (who asked for it)")
    return {"id": job_id, "actor": actor, "force": force, "org_id": org_id}


def _retried(job_id: uuid.UUID, outcome: str, rows: list[Row], org_id: str | None) -> Job:
    job = Job.from_row(rows[0]) if rows else None
    if outcome == "not_found" or job is None or (org_id is not None and job.org_id != org_id):
        raise JobNotFound(job_id)
    if outcome != "retried":
        raise RetryRefused(job_id, outcome, str(job.status))
    return job


async def retry_job(
    conn: AsyncConn,
    job_id: uuid.UUID,
    *,
    actor: str,
    force: bool = False,
    org_id: str | None = None,
) -> Job:
    """Give a failed or cancelled job a new attempt; return it, queued.

    The move (``failed``/``cancelled`` -> ``queued``, reason ``retry``) is recorded in
    the job's history with ``actor``; attempts keep counting. Raises JobNotFound
    (missing, or of another org) or RetryRefused (not ended, an ``at_most_once``
    type without ``force``, a dependency not succeeded): then nothing changed.
    """
    params = _retry_params(job_id, actor, force, org_id)
    # one transaction: the job is read back as the retry left it (queued), before a
    # daemon can claim it
    with db_errors(f"retry of job {job_id}"):
        async with conn.transaction():
            result = await run_for_org(conn, org_id, "jobs_retry", params)
            rows = await run_for_org(conn, org_id, "jobs_get", {"id": job_id})
    return _retried(job_id, str(result[0]["outcome"]), rows, org_id)


def retry_job_sync(
    conn: SyncConn,
    job_id: uuid.UUID,
    *,
    actor: str,
    force: bool = False,
    org_id: str | None = None,
) -> Job:
    """Give a failed or cancelled job a new attempt; see ``retry_job`` (sync)."""
    params = _retry_params(job_id, actor, force, org_id)
    with db_errors(f"retry of job {job_id}"), conn.transaction():  # as retry_job
        result = _run_for_org_sync(conn, org_id, "jobs_retry", params)
        rows = _run_for_org_sync(conn, org_id, "jobs_get", {"id": job_id})
    return _retried(job_id, str(result[0]["outcome"]), rows, org_id)


def cancel_job_sync(
    conn: SyncConn,
    job_id: uuid.UUID,
    *,
    actor: str,
    reason: str,
    org_id: str | None = None,
) -> CancelOutcome:
    """Cancel a job or request its cancel; see ``store.queries.cancel_job`` (sync)."""
    params = {"id": job_id, "org_id": org_id, "reason": reason}
    with db_errors(f"cancel of job {job_id}"):
        with conn.transaction():
            if org_id is not None:
                run_named_sync(conn, "api_set_org", {"org_id": org_id})
            run_named_sync(conn, "admin_set_actor", {"worker_id": actor})
            rows = run_named_sync(conn, "jobs_cancel", params)
        if done := cancel_outcome(rows):
            return done
        rows = _run_for_org_sync(conn, org_id, "jobs_get", {"id": job_id})
    return cancel_unchanged(rows, org_id)


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
        job = _visible(job_id, _run_for_org_sync(conn, org_id, "jobs_get", params), org_id)
        while not job.status.terminal:
            left = _left(deadline)
            if left == 0.0:
                break
            for note in conn.notifies(timeout=left):
                if expected is None or note.payload == expected:
                    break
            job = _visible(job_id, _run_for_org_sync(conn, org_id, "jobs_get", params), org_id)
    return job
