"""Django's tasks framework, from Django itself (6.0 and later) or its backport.

Django 6.0 ships ``django.tasks``; before it, the ``django-tasks`` package provides the
same API as ``django_tasks`` (two exceptions carry an ``Error`` suffix there). Everything
the backend needs from either is taken here, once.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "PACKAGE",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def _package() -> str:
    """Name the package that holds the tasks framework here."""
    try:
        import_module("django.tasks")
    except ImportError:
        pass
    else:
        return "django.tasks"
    try:
        import_module("django_tasks")
    except ImportError as exc:
        raise ImportError(
            "jobsd.contrib.django needs Django's tasks framework: Django 6.0 or later, "
            "or the django-tasks package before it (`pip install 'jobsd[django]'`)",
            name=exc.name,
        ) from exc
    return "django_tasks"


PACKAGE = _package()
_base: Any = import_module(f"{PACKAGE}.base")
_backends: Any = import_module(f"{PACKAGE}.backends.base")
_exceptions: Any = import_module(f"{PACKAGE}.exceptions")
_signals: Any = import_module(f"{PACKAGE}.signals")
_root: Any = import_module(PACKAGE)

DEFAULT_TASK_QUEUE_NAME: str = _base.DEFAULT_TASK_QUEUE_NAME
BaseTaskBackend: Any = _backends.BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
InvalidTask: Any = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
InvalidTaskBackend: Any = (
    getattr(_exceptions, "InvalidTaskBackend", None) or _exceptions.InvalidTaskBackendError
)
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
task_backends: Any = _root.task_backends
"""the backends of ``TASKS`` by alias, made on first use (per thread)"""
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished
_utils: Any = import_module(
    "django.utils.json" if PACKAGE == "django.tasks" else "django_tasks.utils"
)
normalize_json: Any = _utils.normalize_json
