"""The newsletter's settings, plus what the tests need: their own tasks module and a
SQLite database to refuse."""

from __future__ import annotations

from newsletter.settings import *  # noqa: F403
from newsletter.settings import DATABASES, INSTALLED_APPS, TASKS

try:
    import django.tasks  # noqa: F401

    _IMMEDIATE = "django.tasks.backends.immediate.ImmediateBackend"
except ImportError:  # the backport
    _IMMEDIATE = "django_tasks.backends.immediate.ImmediateBackend"

INSTALLED_APPS = [*INSTALLED_APPS]
DATABASES = {
    **DATABASES,
    "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}

# a backend that is not jobsd's: its tasks may still be enqueued on jobsd with .using()
TASKS = {**TASKS, "other": {"BACKEND": _IMMEDIATE}}
