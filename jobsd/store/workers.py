"""One typed function per statement of ``sql/queries/workers.sql``: the daemon's
registration, its lock and its liveness.

The lifeline runs them on its dedicated connection (``open_worker_connection``): the
worker lock is a session lock and lives exactly as long as that connection does.
"""

from __future__ import annotations

from typing import Any

import psycopg

from jobsd.store.db import db_errors
from jobsd.store.listen import open_dedicated_connection
from jobsd.store.queries import run_named

__all__ = [
    "WorkerConnection",
    "deregister_worker",
    "lock_worker",
    "open_worker_connection",
    "ping",
    "register_worker",
    "touch_worker",
]

WorkerConnection = psycopg.AsyncConnection[Any]


async def open_worker_connection(url: str) -> WorkerConnection:
    """Open the lifeline's dedicated connection, retrying with back-off while the
    database is away."""
    return await open_dedicated_connection(
        url, application_name="jobsd-lifeline", operation="worker connection"
    )


async def lock_worker(conn: WorkerConnection, worker_id: str) -> bool:
    """Try the worker's session lock; False while another session holds it."""
    with db_errors(f"lock of worker {worker_id!r}"):
        rows = await run_named(conn, "workers_lock", {"worker_id": worker_id})
    return bool(rows[0]["locked"])


async def register_worker(
    conn: WorkerConnection, worker_id: str, *, hostname: str, pid: int
) -> None:
    """Insert the worker's row (or stamp it when it exists)."""
    params = {"worker_id": worker_id, "hostname": hostname, "pid": pid}
    with db_errors(f"registration of worker {worker_id!r}"):
        await run_named(conn, "workers_register", params)


async def touch_worker(conn: WorkerConnection, worker_id: str) -> bool:
    """Stamp the worker's row; False when the row is gone (deleted by hand)."""
    with db_errors(f"touch of worker {worker_id!r}"):
        rows = await run_named(conn, "workers_touch", {"worker_id": worker_id})
    return bool(rows)


async def deregister_worker(conn: WorkerConnection, worker_id: str) -> None:
    """Delete the worker's row (a clean stop)."""
    with db_errors(f"deregistration of {worker_id!r}"):
        await run_named(conn, "workers_deregister", {"worker_id": worker_id})


async def ping(conn: psycopg.AsyncConnection[Any]) -> None:
    """Run a trivial statement: raise unless the connection answers."""
    with db_errors("ping"):
        await run_named(conn, "workers_ping", {})
