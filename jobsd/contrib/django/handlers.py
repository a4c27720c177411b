"""Register every Django task of the project as a jobsd handler: ``jobsd run`` imports it.

``manage.py jobsd run`` names this module after the project's own (``jobsd run
[MODULE]... jobsd.contrib.django.handlers``): Django is set up, each installed app's
``tasks`` module is imported, and each task a jobsd backend has seen gets a handler of
its module path. A task defined outside an app's ``tasks`` module is found when its
module is named first (``manage.py jobsd run myapp.jobs``).
"""

from __future__ import annotations

import inspect

from jobsd.contrib.django.runner import run_task, run_task_async, setup_django
from jobsd.registry import Registry, default_registry, handler

__all__ = ["register_tasks"]


def register_tasks(registry: Registry | None = None) -> list[str]:
    """Give each Django task seen by a jobsd backend a handler; return their types."""
    from django.utils.module_loading import autodiscover_modules

    from jobsd.contrib.django.backend import declared_tasks

    autodiscover_modules("tasks")
    target = registry or default_registry
    registered = []
    for path, task in sorted(declared_tasks().items()):
        if target.get(path) is not None:
            continue
        run = run_task_async if inspect.iscoroutinefunction(task.func) else run_task
        max_attempts = task.get_backend().config.max_attempts
        handler(path, max_attempts=max_attempts, registry=target)(run)
        registered.append(path)
    return registered


setup_django()
register_tasks()
