"""The Django app of jobsd: its ``manage.py jobsd`` command and its schema migration."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["JobsdConfig"]


class JobsdConfig(AppConfig):  # type: ignore[misc]
    """``INSTALLED_APPS = [..., "jobsd.contrib.django"]``."""

    name = "jobsd.contrib.django"
    label = "jobsd"
    verbose_name = "jobsd"
    default_auto_field = "django.db.models.BigAutoField"
