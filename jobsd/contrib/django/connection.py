"""The database a Django task backend enqueues into: one of Django's own connections.

Enqueues run on Django's connection of the backend's database alias, so they join the
request's transaction; the daemon and the jobsd commands reach the same database
through the libpq connection string built from the same ``DATABASES`` entry.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

__all__ = ["check_database", "connection_string", "raw_connection"]

# what Django's PostgreSQL backend hands psycopg besides libpq's own keywords
_NOT_LIBPQ = frozenset({"cursor_factory", "context", "prepare_threshold"})


def check_database(alias: str) -> None:
    """Refuse a database alias jobsd cannot enqueue into (ImproperlyConfigured): an
    unknown one, another engine than PostgreSQL, or PostgreSQL through psycopg2."""
    if alias not in connections.settings:
        raise ImproperlyConfigured(
            f"jobsd's task backend names database {alias!r}, which is not in DATABASES"
        )
    engine = connections.settings[alias].get("ENGINE", "")
    vendor = connections[alias].vendor
    if vendor != "postgresql":
        raise ImproperlyConfigured(
            f"jobsd's task backend needs PostgreSQL: database {alias!r} uses {engine!r}. "
            "jobsd keeps its jobs in PostgreSQL, in the same transactions as your data"
        )
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        raise ImproperlyConfigured(
            f"jobsd's task backend needs Django to use psycopg 3 for database {alias!r}"
        )


def raw_connection(alias: str) -> psycopg.Connection[Any]:
    """Return the psycopg connection under Django's connection ``alias`` (opened if it
    was not): a statement on it joins Django's current transaction."""
    wrapper = connections[alias]
    # as Django's own cursors do: a connection kept across requests (CONN_MAX_AGE) is
    # checked first when CONN_HEALTH_CHECKS asks for it
    wrapper.close_if_health_check_failed()
    wrapper.ensure_connection()
    raw: psycopg.Connection[Any] = wrapper.connection
    return raw


def connection_string(alias: str) -> str:
    """Return the libpq connection string of Django's database ``alias``: what the
    daemon and the jobsd commands connect with."""
    params = connections[alias].get_connection_params()
    kept = {
        key: value
        for key, value in params.items()
        if key not in _NOT_LIBPQ and isinstance(value, str | int) and value != ""
    }
    return psycopg.conninfo.make_conninfo("", **kept)
