"""Register every Django task of the project as a jobsd handler: ``jobsd run`` imports it.

``manage.py jobsd run`` names this module after the project's own (``jobsd run
[MODULE]... jobsd.contrib.django.handlers``): Django is set up, each installed app's
``tasks`` module is imported, and each task gets a handler of its module path: every
task held by a module imported by then, whatever its backend (a task declared on another
backend may be enqueued on jobsd's with ``.using()``). A task defined outside the apps'
``tasks`` modules is found when its module is named first (``manage.py jobsd run
myproject.jobs``).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from jobsd.contrib.django.runner import run_task, run_task_async, setup_django
from jobsd.registry import Registry, default_registry, handler

__all__ = ["register_tasks"]


def register_tasks(registry: Registry | None = None) -> list[str]:
    """Give each Django task of the project a handler; return their types."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks")
    target = registry or default_registry
    registered = []
    for path, task in sorted(_project_tasks().items()):
        if target.get(path) is not None:
            continue
        run = run_task_async if inspect.iscoroutinefunction(task.func) else run_task
        handler(path, max_attempts=_max_attempts(task), registry=target)(run)
        registered.append(path)
    return registered


def _project_tasks() -> dict[str, Any]:
    """Return the tasks jobsd backends have seen, and every task held at module level
    by a module imported so far (the apps' ``tasks`` modules, the modules named to the
    daemon), by module path."""
    from jobsd.contrib.django.backend import declared_tasks
    from jobsd.contrib.django.tasksapi import Task

    found = declared_tasks()
    skipped = (*sys.stdlib_module_names, "django", "django_tasks", "jobsd")
    for name, module in list(sys.modules.items()):
        if module is None or name.partition(".")[0] in skipped:
            continue
        try:
            values = list(vars(module).values())
        except TypeError:  # an object standing in sys.modules without a __dict__
            continue
        for value in values:
            if isinstance(value, Task) and value.module_path not in found:
                found[value.module_path] = value
    return found


def _max_attempts(task: Any) -> int:
    """Return the runs a task's jobs get: its backend's ``MAX_ATTEMPTS``, or the first
    jobsd backend's when its own is another backend, or none of TASKS."""
    try:
        config = getattr(task.get_backend(), "config", None)
    except Exception:  # its backend is not in TASKS (any more)
        config = None
    if config is None:
        from jobsd.contrib.django.options import jobsd_backends
        from jobsd.contrib.django.tasksapi import task_backends

        aliases = sorted(jobsd_backends())
        config = task_backends[aliases[0]].config if aliases else None
    return config.max_attempts if config is not None else 1


setup_django()
register_tasks()
