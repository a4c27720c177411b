"""Cancel a job: at once when it has not started, by request when it runs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from jobsd.errors import CancelRefused, JobNotFound
from jobsd.models import Job, JobStatus
from jobsd.ops.caller import Caller
from jobsd.store import jobs_ops as store
from jobsd.store.db import AsyncConn, SyncConn
from jobsd.store.jobs_ops import CancelAnswer

__all__ = ["CancelOutcome", "cancel_job", "cancel_job_sync"]


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What a cancel achieved: the job is ``cancelled``, or it runs and its cancel is
    ``requested`` (its handler stops at once, then the job is cancelled unless it
    finishes first). ``changed`` is False when an earlier cancel did it already."""

    action: Literal["cancelled", "requested"]
    job: Job
    changed: bool


def _outcome(job_id: uuid.UUID, answer: CancelAnswer) -> CancelOutcome:
    """Decide what a cancel's answer means; refusals raise."""
    job = answer.job
    if job is None:
        raise JobNotFound(job_id)
    if answer.previous is not None:
        action: Literal["cancelled", "requested"] = (
            "requested" if answer.previous is JobStatus.RUNNING else "cancelled"
        )
        return CancelOutcome(action, job, answer.changed)
    match job.status:
        case JobStatus.CANCELLED:
            return CancelOutcome("cancelled", job, False)
        case JobStatus.RUNNING:  # running with a request pending: jobs_cancel keeps it
            return CancelOutcome("requested", job, False)
        case JobStatus.SUCCEEDED | JobStatus.FAILED:
            raise CancelRefused(job_id, "finished", str(job.status))
        case JobStatus.RECOVERY_REQUIRED:
            raise CancelRefused(job_id, "recovery_required", str(job.status))
        case _:  # queued, scheduled or blocked after the cancel looked: a race
            raise CancelRefused(job_id, "changed", str(job.status))


async def cancel_job(
    conn: AsyncConn, caller: Caller, job_id: uuid.UUID, *, reason: str
) -> CancelOutcome:
    """Cancel the job, or request the cancel of a running one; idempotent.

    ``reason`` is the cancelled job's reason; the history names ``caller.actor``, for
    a request too. Raises JobNotFound (missing, or of another org) and CancelRefused
    (finished, awaiting recovery, or changed meanwhile): then nothing changed.
    """
    answer = await store.cancel(
        conn, job_id, actor=caller.actor, reason=reason, org_id=caller.scope
    )
    return _outcome(job_id, answer)


def cancel_job_sync(
    conn: SyncConn, caller: Caller, job_id: uuid.UUID, *, reason: str
) -> CancelOutcome:
    """Cancel the job, or request its cancel; see ``cancel_job`` (sync)."""
    answer = store.cancel_sync(conn, job_id, actor=caller.actor, reason=reason, org_id=caller.scope)
    return _outcome(job_id, answer)
