"""The handler of every Django task in the daemon: run the task its job names.

One function serves every task type (the job's type is the task's module path), sync or
async, so that a handler process can import it by name: a sync task runs in one of the
daemon's handler processes (``isolation="auto"``), an async one in its event loop. A
handler process sets Django up on its first job (``DJANGO_SETTINGS_MODULE`` comes with
the daemon's environment).
"""

from __future__ import annotations

from typing import Any

from jobsd.context import JobContext
from jobsd.errors import ConfigError

__all__ = ["run_task", "run_task_async", "setup_django"]


def run_task(ctx: JobContext) -> dict[str, Any]:
    """Run the sync task of the job, between Django's request-like connection checks."""
    from django.db import close_old_connections

    task, call_args, kwargs, result = _prepare(ctx)
    _signal_started(result)
    close_old_connections()
    try:
        value = task.func(*call_args, **kwargs)
    except BaseException:
        _signal_finished(result, failed=True)
        raise
    finally:
        close_old_connections()
    return _finished(task, result, value)


async def run_task_async(ctx: JobContext) -> dict[str, Any]:
    """Run the async task of the job in the daemon's event loop."""
    task, call_args, kwargs, result = _prepare(ctx)
    _signal_started(result)
    try:
        value = await task.func(*call_args, **kwargs)
    except BaseException:
        _signal_finished(result, failed=True)
        raise
    return _finished(task, result, value)


def _prepare(ctx: JobContext) -> tuple[Any, list[Any], dict[str, Any], Any]:
    """Return the job's task, its positional arguments (the context first, for a task
    that takes it), its keyword arguments, and its running result."""
    setup_django()
    from jobsd.contrib.django.results import load_task
    from jobsd.contrib.django.tasksapi import TaskContext, TaskResult, TaskResultStatus

    task = load_task(ctx.type)
    if task is None:
        raise ConfigError(f"job type {ctx.type!r} names no Django task (module path of a @task)")
    args = list(ctx.payload.get("args", []))
    kwargs = dict(ctx.payload.get("kwargs", {}))
    if task.takes_context:
        # the context's result is the job as read now: attempts, workers and all
        result = task.get_backend().get_result(str(ctx.id))
        return task, [TaskContext(task_result=result), *args], kwargs, result
    result = TaskResult(
        task=task,
        id=str(ctx.id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=args,
        kwargs=kwargs,
        backend=task.backend,
        errors=[],
        worker_ids=[],
    )
    return task, args, kwargs, result


def _finished(task: Any, result: Any, value: Any) -> dict[str, Any]:
    """Return the job's report holding the task's return value (a JSON value)."""
    from jobsd.contrib.django.results import RETURN_VALUE
    from jobsd.contrib.django.tasksapi import normalize_json

    try:
        returned = normalize_json(value)
    except (TypeError, ValueError) as exc:
        _signal_finished(result, failed=True)
        raise TypeError(
            f"task {task.module_path} returned a value that is not JSON ({exc})"
        ) from None
    _signal_finished(result, failed=False)
    return {RETURN_VALUE: returned}


def _signal_started(result: Any) -> None:
    from jobsd.contrib.django.tasksapi import task_started

    task_started.send(type(result.task.get_backend()), task_result=result)


def _signal_finished(result: Any, *, failed: bool) -> None:
    from jobsd.contrib.django.tasksapi import TaskResultStatus, task_finished

    status = TaskResultStatus.FAILED if failed else TaskResultStatus.SUCCESSFUL
    object.__setattr__(result, "status", status)
    task_finished.send(type(result.task.get_backend()), task_result=result)


def setup_django() -> None:
    """Set Django up in a handler process, once (the daemon did before its handlers)."""
    import os

    from django.apps import apps

    if apps.ready:
        return
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise ConfigError(
            "a Django task runs with Django set up: run the daemon with `manage.py jobsd "
            "run`, or set DJANGO_SETTINGS_MODULE"
        )
    import django

    django.setup()
