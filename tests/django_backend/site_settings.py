"""The newsletter's settings, plus what the tests need: their own tasks module and a
SQLite database to refuse."""

from __future__ import annotations

from newsletter.settings import *  # noqa: F403
from newsletter.settings import DATABASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS]
DATABASES = {
    **DATABASES,
    "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
