"""The gateway to Postgres: the only package that imports psycopg or runs a statement.

``connect`` opens every connection and pool (TLS policy, keepalives, application
names); one module per file of ``sql/queries`` holds one typed function per
statement (``queries`` for jobs, ``api``, ``tokens``, ``queues``, ``enqueue``,
``retention``, ``snapshot``, ``roles``, ``admin``); ``db`` translates psycopg errors
once and retries transient ones. Callers pass their own connections typed with the
aliases below.
"""

from jobsd.store.db import AsyncConn, SyncConn

__all__ = ["AsyncConn", "SyncConn"]
