"""Read a job: its row, its retry and its history, as the caller may see it."""

from __future__ import annotations

import uuid

from jobsd.errors import JobNotFound
from jobsd.models import JobStatus, JobView
from jobsd.ops.caller import Caller
from jobsd.store import jobs_ops as store
from jobsd.store.db import AsyncConn, SyncConn

__all__ = ["get_job", "get_job_sync", "job_status"]


async def get_job(conn: AsyncConn, caller: Caller, job_id: uuid.UUID) -> JobView:
    """Return the job with its history; JobNotFound if missing or of another org."""
    view = await store.get_view(conn, job_id, caller.scope)
    if view is None:
        raise JobNotFound(job_id)
    return view


def get_job_sync(conn: SyncConn, caller: Caller, job_id: uuid.UUID) -> JobView:
    """Return the job with its history; see ``get_job`` (sync)."""
    view = store.get_view_sync(conn, job_id, caller.scope)
    if view is None:
        raise JobNotFound(job_id)
    return view


async def job_status(conn: AsyncConn, caller: Caller, job_id: uuid.UUID) -> JobStatus | None:
    """Return only the job's status, or None when the caller sees no such job (the
    cheap re-read of a long-poll)."""
    return await store.status_of(conn, job_id, caller.scope)
