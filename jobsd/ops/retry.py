"""Retry a failed or cancelled job: a new job, admitted like any enqueue.

The retried job stays as it ended; its history notes ``retried as <id>`` and reads
show the link (``retried_as``); the new job carries ``retry_of``. The new job is
refused like an enqueue when its queue is full or its org holds its quota of open
jobs (QueueFull, OrgQuotaExceeded: nothing written). A job is retried once: asking
again returns the retry made the first time (``created`` False), as an enqueue with a
job id returns the job that holds it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from jobsd.errors import JobNotFound, RetryRefused
from jobsd.ids import uuid7
from jobsd.models import Job
from jobsd.ops.caller import Caller
from jobsd.store import jobs_ops as store
from jobsd.store.db import AsyncConn, SyncConn
from jobsd.store.jobs_ops import RetryAnswer

__all__ = ["Retried", "retry_job", "retry_job_sync"]


@dataclass(frozen=True, slots=True)
class Retried:
    """The retry: the new job (``job.retry_of`` is the retried job); ``created`` is
    False when an earlier retry made it."""

    job: Job
    created: bool


def _outcome(job_id: uuid.UUID, answer: RetryAnswer) -> Retried:
    if answer.outcome in ("retried", "already_retried") and answer.job is not None:
        return Retried(answer.job, answer.outcome == "retried")
    if answer.outcome == "not_found" or answer.status is None:
        raise JobNotFound(job_id)
    raise RetryRefused(job_id, answer.outcome, str(answer.status))


async def retry_job(
    conn: AsyncConn, caller: Caller, job_id: uuid.UUID, *, force: bool = False
) -> Retried:
    """Retry the job as a new one. Raises JobNotFound, RetryRefused (not ended, an
    ``at_most_once`` type without ``force``, a dependency not succeeded), QueueFull or
    OrgQuotaExceeded: then nothing was written."""
    answer = await store.retry(
        conn, job_id, new_id=uuid7(), actor=caller.actor, force=force, org_id=caller.scope
    )
    return _outcome(job_id, answer)


def retry_job_sync(
    conn: SyncConn, caller: Caller, job_id: uuid.UUID, *, force: bool = False
) -> Retried:
    """Retry the job as a new one; see ``retry_job`` (sync)."""
    answer = store.retry_sync(
        conn, job_id, new_id=uuid7(), actor=caller.actor, force=force, org_id=caller.scope
    )
    return _outcome(job_id, answer)
