"""jobsd's schema in Django's migrations: applied on the databases jobsd's backends use."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from jobsd.contrib.django.options import jobsd_backends
from jobsd.store.migrate import apply_pending

__all__ = ["apply_schema"]


def apply_schema(connection: Any, *, up_to: int) -> list[str]:
    """Apply jobsd's migrations up to ``up_to`` on Django's ``connection`` when a jobsd
    task backend writes to its database; return the names applied. A database no jobsd
    backend names is left alone; one that is not PostgreSQL is refused, named."""
    databases = set(jobsd_backends().values())
    if connection.alias not in databases:
        return []
    if connection.vendor != "postgresql":
        engine = connection.settings_dict.get("ENGINE", "")
        raise ImproperlyConfigured(
            f"jobsd's schema needs PostgreSQL: database {connection.alias!r}, which a "
            f"jobsd task backend writes to, uses {engine!r}"
        )
    connection.ensure_connection()
    return apply_pending(connection.connection, up_to=up_to)
