"""The Django app of jobsd: its ``manage.py jobsd`` command, its schema migration, and
a system check of its task backends."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks

__all__ = ["JobsdConfig", "check_backends"]


class JobsdConfig(AppConfig):  # type: ignore[misc]
    """``INSTALLED_APPS = [..., "jobsd.contrib.django"]``."""

    name = "jobsd.contrib.django"
    label = "jobsd"
    verbose_name = "jobsd"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        checks.register(check_backends)


def check_backends(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """``manage.py check``: each jobsd task backend of TASKS can be made (its options
    are known, its database is PostgreSQL)."""

    from jobsd.contrib.django.options import jobsd_backends
    from jobsd.contrib.django.tasksapi import task_backends

    errors = []
    for alias in jobsd_backends():
        try:
            task_backends[alias]
        except Exception as exc:
            errors.append(checks.Error(str(exc), obj=f"TASKS[{alias!r}]", id="jobsd.E001"))
    return errors
