"""A jobsd job, read as the ``TaskResult`` of the Django task it runs.

Statuses: ``queued``, ``scheduled`` and ``blocked`` are READY; ``running`` is RUNNING,
and so is ``recovery_required`` (its run's daemon died; an operator decides what it
became); ``succeeded`` is SUCCESSFUL; ``failed`` and ``cancelled`` are FAILED.
"""

from __future__ import annotations

import json
from typing import Any

from django.utils.module_loading import import_string

from jobsd.contrib.django.tasksapi import (
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from jobsd.models import Job, JobStatus, JobView

__all__ = ["RETURN_VALUE", "load_task", "status_of", "task_result"]

RETURN_VALUE = "return_value"
"""the key of a finished task's return value in its job's report"""

_READY = frozenset({JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.BLOCKED})


def status_of(status: JobStatus) -> Any:
    """Return the ``TaskResultStatus`` of a job's status."""
    if status in _READY:
        return TaskResultStatus.READY
    if status is JobStatus.SUCCEEDED:
        return TaskResultStatus.SUCCESSFUL
    if status in (JobStatus.FAILED, JobStatus.CANCELLED):
        return TaskResultStatus.FAILED
    return TaskResultStatus.RUNNING


def load_task(path: str) -> Any:
    """Return the Task a job type names (its module path), or None when it names none."""
    try:
        found = import_string(path)
    except ImportError:
        return None
    return found if isinstance(found, Task) else None


def task_result(view: JobView, backend: str) -> Any:
    """Return the TaskResult of a job and its history (TaskResultDoesNotExist when the
    job does not run a Django task of this project)."""
    job = view.job
    task = load_task(job.type)
    if task is None:
        raise TaskResultDoesNotExist(
            f"job {job.id} is of type {job.type!r}, which names no task of this project"
        )
    payload = _json(job.payload) or {}
    status = status_of(job.status)
    result = TaskResult(
        task=task,
        id=str(job.id),
        status=status,
        enqueued_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=job.started_at,
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=backend,
        errors=_errors(job) if status == TaskResultStatus.FAILED else [],
        worker_ids=[
            event.worker_id or "" for event in view.history if event.to_status is JobStatus.RUNNING
        ],
    )
    report = _json(job.report)
    if status == TaskResultStatus.SUCCESSFUL and isinstance(report, dict):
        object.__setattr__(result, "_return_value", report.get(RETURN_VALUE))
    return result


def _errors(job: Job) -> list[Any]:
    """The error of a failed or cancelled job: the task's exception when it raised one
    (its class and traceback), else what ended the job."""
    report = _json(job.report)
    cause = report.get("error") if isinstance(report, dict) else None
    if isinstance(cause, dict) and isinstance(cause.get("traceback"), str):
        return [
            TaskError(
                exception_class_path=str(cause.get("type") or "builtins.Exception"),
                traceback=cause["traceback"],
            )
        ]
    ended = "JobCancelled" if job.status is JobStatus.CANCELLED else "JobEnded"
    words = [w for w in (job.reason, job.error) if w]
    return [
        TaskError(
            exception_class_path=f"jobsd.contrib.django.errors.{ended}",
            traceback=": ".join(words) or str(job.status),
        )
    ]


def _json(value: Any) -> Any:
    """Return a JSON column's value: Django's connections read jsonb as text."""
    return json.loads(value) if isinstance(value, str) else value
