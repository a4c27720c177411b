"""``JobsdBackend``: Django's tasks run as jobsd jobs.

Each task is a job type, its module path (``shop.tasks.send_receipt``); its arguments are
the payload ``{"args": [...], "kwargs": {...}}``. The enqueue is an INSERT on Django's
own connection: inside ``transaction.atomic()`` the job exists if and only if the block
commits; outside one it commits at once. Priorities keep Django's order (higher runs
sooner: jobsd's priority is its negation), ``run_after`` schedules, and the result is read
back from the job (``results.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from jobsd.contrib.django.connection import check_database, raw_connection
from jobsd.contrib.django.options import BackendOptions
from jobsd.contrib.django.results import task_result
from jobsd.contrib.django.runner import BACKEND_KEY
from jobsd.contrib.django.tasksapi import (
    BaseTaskBackend,
    InvalidTaskBackend,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from jobsd.errors import DatabaseError, InvalidPayload, JobNotFound
from jobsd.jobspec import JobSpec
from jobsd.ops.caller import Caller
from jobsd.ops.get import get_job_sync
from jobsd.store.enqueue import enqueue_sync

__all__ = ["JobsdBackend", "declared_tasks"]

# every task validated by a jobsd backend in this process, by module path: the daemon
# registers a handler for each (``handlers.py``)
_DECLARED: dict[str, Any] = {}

_ACTOR = "django"


def declared_tasks() -> dict[str, Any]:
    """Return the tasks of jobsd backends this process has seen, by module path."""
    return dict(_DECLARED)


class JobsdBackend(BaseTaskBackend):  # type: ignore[misc]
    """A backend of Django's tasks framework that runs every task as a jobsd job."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.config = BackendOptions.parse(alias, params)
        try:
            check_database(self.config.database)
        except Exception as exc:
            raise InvalidTaskBackend(f"TASKS[{alias!r}]: {exc}") from exc

    def validate_task(self, task: Any) -> None:
        """Check the task as every backend does, and remember it for the daemon."""
        super().validate_task(task)
        _DECLARED[task.module_path] = task

    def enqueue(self, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Create the task's job on Django's connection, in its current transaction."""
        self.validate_task(task)
        arguments = _arguments(task, args, kwargs)
        spec = JobSpec.build(
            task.module_path,
            {**arguments, BACKEND_KEY: self.alias},
            org_id=self.config.org_id,
            max_payload_bytes=self.config.max_payload_bytes,
            queue=task.queue_name,
            priority=-int(task.priority),
            run_after=_aware(task.run_after),
        )
        database = self.config.database
        with _marking_errors(database):
            if connections[database].get_autocommit():
                # the one INSERT commits, or fails, on its own
                job = enqueue_sync(raw_connection(database), spec)
            else:
                # a savepoint inside the caller's transaction: a refused insert (a
                # full queue) leaves that transaction usable
                with transaction.atomic(using=database):
                    job = enqueue_sync(raw_connection(database), spec)
        result = TaskResult(
            task=task,
            id=str(job.id),
            status=TaskResultStatus.READY,
            enqueued_at=job.created_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=arguments["args"],
            kwargs=arguments["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """Read a task's result from its job (TaskResultDoesNotExist when there is none
        of this backend's org)."""
        try:
            key = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(f"no task result {result_id!r}") from None
        database = self.config.database
        caller = Caller.for_org(self.config.org_id, _ACTOR)
        try:
            with _marking_errors(database), transaction.atomic(using=database):
                view = get_job_sync(raw_connection(database), caller, key)
        except JobNotFound:
            raise TaskResultDoesNotExist(f"no task result {result_id!r}") from None
        return task_result(view, self.alias)


@contextmanager
def _marking_errors(database: str) -> Iterator[None]:
    """Tell Django when a statement of jobsd's failed on its connection, as its own
    cursors do: the connection is then checked, and dropped if dead, at the end of the
    request (``close_old_connections``) rather than kept for the next one."""
    try:
        yield
    except DatabaseError:
        connections[database].errors_occurred = True
        raise


def _arguments(task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Return the task's arguments as JSON values, or InvalidPayload naming the first
    one that is not (a datetime, a model instance, ...)."""
    named: list[tuple[str, Any]] = [(f"argument {i}", value) for i, value in enumerate(args)]
    named += [(f"argument {name!r}", value) for name, value in kwargs.items()]
    for what, value in named:
        try:
            normalize_json(value)
        except (TypeError, ValueError) as exc:
            raise InvalidPayload(
                f"{what} of task {task.module_path} is not a JSON value ({exc}): use "
                "str, int, float, bool, None, lists and dicts of them, e.g. a model's pk"
            ) from None
    return {"args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs))}


def _aware(run_after: datetime | None) -> datetime | None:
    """Return ``run_after`` timezone-aware (a naive one is in Django's current time zone,
    as Django reads it when ``USE_TZ`` is False)."""
    if run_after is None or timezone.is_aware(run_after):
        return run_after
    aware: datetime = timezone.make_aware(run_after)
    return aware
