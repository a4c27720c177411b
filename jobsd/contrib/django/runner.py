"""The handler of every Django task in the daemon: run the task its job names.

One function serves every task type (the job's type is the task's module path), sync or
async, so that a handler process can import it by name: a sync task runs in one of the
daemon's handler processes (``isolation="auto"``), an async one in its event loop. A
handler process sets Django up on its first job (``DJANGO_SETTINGS_MODULE`` comes with
the daemon's environment). Django's stale connections are closed before and after
each task, as Django does around a request.
"""

from __future__ import annotations

import logging
from typing import Any

from jobsd.context import JobContext
from jobsd.errors import ConfigError

__all__ = ["BACKEND_KEY", "run_task", "run_task_async", "setup_django"]

BACKEND_KEY = "backend"
"""the payload's key naming the TASKS alias the task was enqueued through"""

log = logging.getLogger(__name__)


def run_task(ctx: JobContext) -> dict[str, Any]:
    """Run the sync task of the job."""
    setup_django()
    from django.db import close_old_connections

    close_old_connections()
    try:
        task, args, kwargs = _task_of(ctx)
        result = task.get_backend().get_result(str(ctx.id)) if task.takes_context else None
        return _run_sync(task, ctx, args, kwargs, result)
    finally:
        close_old_connections()


async def run_task_async(ctx: JobContext) -> dict[str, Any]:
    """Run the async task of the job in the daemon's event loop."""
    setup_django()
    from asgiref.sync import sync_to_async
    from django.db import close_old_connections

    close = sync_to_async(close_old_connections, thread_sensitive=True)
    await close()
    try:
        task, args, kwargs = _task_of(ctx)
        result = await task.get_backend().aget_result(str(ctx.id)) if task.takes_context else None
        started = _started(task, ctx, args, kwargs, result)
        try:
            value = await task.func(*_with_context(task, started, args), **kwargs)
        except BaseException:
            _signal_finished(started, failed=True)
            raise
        return _finished(task, started, value)
    finally:
        await close()


def _run_sync(
    task: Any, ctx: JobContext, args: list[Any], kwargs: dict[str, Any], result: Any
) -> dict[str, Any]:
    started = _started(task, ctx, args, kwargs, result)
    try:
        value = task.func(*_with_context(task, started, args), **kwargs)
    except BaseException:
        _signal_finished(started, failed=True)
        raise
    return _finished(task, started, value)


def _task_of(ctx: JobContext) -> tuple[Any, list[Any], dict[str, Any]]:
    """Return the job's task (on the backend it was enqueued through), its positional
    and its keyword arguments."""
    from jobsd.contrib.django.results import load_task

    task = load_task(ctx.type)
    if task is None:
        raise ConfigError(f"job type {ctx.type!r} names no Django task (module path of a @task)")
    alias = ctx.payload.get(BACKEND_KEY)
    if isinstance(alias, str) and alias != task.backend:
        task = task.using(backend=alias)
    return task, list(ctx.payload.get("args", [])), dict(ctx.payload.get("kwargs", {}))


def _started(
    task: Any, ctx: JobContext, args: list[Any], kwargs: dict[str, Any], result: Any
) -> Any:
    """Return the running result the signals carry (the one read, for a task taking the
    context), after sending ``task_started``."""
    from jobsd.contrib.django.tasksapi import TaskResult, TaskResultStatus, task_started

    if result is None:
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
    _send(task_started, result)
    return result


def _with_context(task: Any, result: Any, args: list[Any]) -> list[Any]:
    """Return the positional arguments, the context first for a task that takes it."""
    if not task.takes_context:
        return args
    from jobsd.contrib.django.tasksapi import TaskContext

    return [TaskContext(task_result=result), *args]


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


def _signal_finished(result: Any, *, failed: bool) -> None:
    from jobsd.contrib.django.tasksapi import TaskResultStatus, task_finished

    status = TaskResultStatus.FAILED if failed else TaskResultStatus.SUCCESSFUL
    object.__setattr__(result, "status", status)
    _send(task_finished, result)


def _send(signal: Any, result: Any) -> None:
    """Send a signal of Django's tasks; a receiver that raises is logged, and changes
    nothing of the task's run or outcome."""
    answers = signal.send_robust(type(result.task.get_backend()), task_result=result)
    for receiver, answer in answers:
        if isinstance(answer, Exception):
            log.warning(
                "django.signal_receiver_failed",
                extra={"receiver": repr(receiver), "error": repr(answer), "job_id": result.id},
            )


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
