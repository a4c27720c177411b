"""Settle a ``recovery_required`` job: its work was done, was not, or runs again."""

from __future__ import annotations

import enum
import uuid

from jobsd.errors import JobNotFound, ResolveRefused
from jobsd.models import Job, JobStatus
from jobsd.ops.caller import Caller
from jobsd.store import jobs_ops as store
from jobsd.store.db import AsyncConn

__all__ = ["Resolution", "resolve_job"]


class Resolution(enum.StrEnum):
    """How a job whose outcome was unknown is settled."""

    SUCCEEDED = "succeeded"
    """the work was done"""
    FAILED = "failed"
    """the work was not done, and will not be"""
    REQUEUE = "requeue"
    """run the job again (queued)"""


_STATUS = {
    Resolution.SUCCEEDED: JobStatus.SUCCEEDED,
    Resolution.FAILED: JobStatus.FAILED,
    Resolution.REQUEUE: JobStatus.QUEUED,
}


async def resolve_job(
    conn: AsyncConn, caller: Caller, job_id: uuid.UUID, how: Resolution | str
) -> Job:
    """Settle the job as ``how`` says; return it as written (reason ``resolved``, the
    history names the caller). Raises ValueError for an unknown ``how``, JobNotFound
    (missing, or of another org) and ResolveRefused (not recovery_required)."""
    try:
        resolution = Resolution(how)
    except ValueError:
        raise ValueError(f"resolve how: succeeded, failed or requeue, not {how!r}") from None
    written, now = await store.resolve(
        conn,
        job_id,
        status=_STATUS[resolution],
        reason=f"resolved as {resolution} by {'an operator' if caller.operator else 'its org'}",
        actor=caller.actor,
        error="resolved as failed" if resolution is Resolution.FAILED else None,
        org_id=caller.scope,
    )
    if written is not None:
        return written
    if now is None:
        raise JobNotFound(job_id)
    raise ResolveRefused(job_id, str(now.status))
