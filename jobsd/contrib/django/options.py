"""The settings of one jobsd task backend: its ``TASKS`` entry, checked once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from jobsd.settings import Settings

__all__ = ["KNOWN_OPTIONS", "KNOWN_PARAMS", "BackendOptions", "jobsd_backends"]

KNOWN_PARAMS = frozenset({"BACKEND", "QUEUES", "OPTIONS"})
KNOWN_OPTIONS = frozenset({"DATABASE", "MAX_ATTEMPTS", "ORG_ID"})


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """What a jobsd backend's ``TASKS`` entry says."""

    database: str
    """the alias in ``DATABASES`` the jobs are written through (``default``)"""
    org_id: str
    """the org the tasks' jobs belong to (``JOBSD_DEFAULT_ORG``, else ``default``)"""
    max_payload_bytes: int | None
    """the largest arguments a task may take, as JSON (``JOBSD_MAX_PAYLOAD_BYTES``)"""
    max_attempts: int = 1
    """the runs a task's job may get: a run cut short (its daemon died or shut down)
    is run again while runs remain; a task that raises fails at once whatever it says"""

    @classmethod
    def parse(cls, alias: str, params: dict[str, Any]) -> BackendOptions:
        """Check a ``TASKS`` entry (ImproperlyConfigured names what is wrong)."""
        unknown = sorted(set(params) - KNOWN_PARAMS)
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}] has an entry jobsd does not know: {unknown[0]!r} "
                f"(known: {', '.join(sorted(KNOWN_PARAMS))})"
            )
        options = params.get("OPTIONS", {})
        if not isinstance(options, dict):
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS'] must be a dict")
        unknown = sorted(set(options) - KNOWN_OPTIONS)
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS'] has an option jobsd does not know: "
                f"{unknown[0]!r} (known: {', '.join(sorted(KNOWN_OPTIONS))})"
            )
        try:
            settings = Settings()
        except Exception as exc:  # a JOBSD_* variable the backend reads is wrong
            raise ImproperlyConfigured(f"TASKS[{alias!r}]: {exc}") from exc
        database = options.get("DATABASE", "default")
        org_id = options.get("ORG_ID", settings.default_org or "default")
        for name, value in (("DATABASE", database), ("ORG_ID", org_id)):
            if not isinstance(value, str) or not value:
                raise ImproperlyConfigured(
                    f"TASKS[{alias!r}]['OPTIONS'][{name!r}] must be a non-empty string"
                )
        max_attempts = options.get("MAX_ATTEMPTS", 1)
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS'] must be a whole number of at "
                f"least 1, got {max_attempts!r}"
            )
        return cls(database, org_id, settings.max_payload_bytes, max_attempts)


def jobsd_backends(tasks: dict[str, Any] | None = None) -> dict[str, str]:
    """Return the aliases of ``tasks`` (the ``TASKS`` setting by default) whose backend
    is jobsd's, each with the ``DATABASES`` alias it writes through (read without
    making the backend)."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    if tasks is None:
        tasks = getattr(settings, "TASKS", None) or {}

    from jobsd.contrib.django.backend import JobsdBackend

    found: dict[str, str] = {}
    for alias, entry in tasks.items():
        try:
            backend = import_string(entry.get("BACKEND", ""))
        except ImportError:
            continue
        if isinstance(backend, type) and issubclass(backend, JobsdBackend):
            options = entry.get("OPTIONS") or {}
            found[alias] = options.get("DATABASE", "default")
    return found
