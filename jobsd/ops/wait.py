"""Wait until a job ends, woken by the database's notification of its end."""

from __future__ import annotations

import uuid

from jobsd.models import Job
from jobsd.ops.caller import Caller
from jobsd.store import jobs_ops as store

__all__ = ["wait_job", "wait_job_sync"]


async def wait_job(url: str, caller: Caller, job_id: uuid.UUID, *, timeout_s: float | None) -> Job:
    """Return the job once it ends, or as it is after ``timeout_s`` (None: no limit).

    On a connection of its own (``LISTEN``). Raises JobNotFound (missing, or of
    another org), BackendUnavailable, ValueError for a negative timeout.
    """
    return await store.wait_job(url, job_id, timeout_s=timeout_s, org_id=caller.scope)


def wait_job_sync(url: str, caller: Caller, job_id: uuid.UUID, *, timeout_s: float | None) -> Job:
    """Return the job once it ends, or after ``timeout_s``; see ``wait_job`` (sync)."""
    return store.wait_job_sync(url, job_id, timeout_s=timeout_s, org_id=caller.scope)
