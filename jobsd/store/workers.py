"""One typed function per statement of ``sql/queries/workers.sql`` that the daemon's
lifeline runs: its registration, its lock and its liveness.

The lifeline runs them on its dedicated connection (``open_worker_connection``): the
worker lock is a session lock and lives exactly as long as that connection does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobsd.store.connect import open_connection_async
from jobsd.store.db import AsyncConn, db_errors
from jobsd.store.named import run_named
from jobsd.store.retries import transient_retries

__all__ = [
    "TypeRule",
    "deregister_worker",
    "end_session",
    "lock_worker",
    "open_worker_connection",
    "register_worker",
    "renew_worker",
]


async def open_worker_connection(url: str) -> AsyncConn:
    """Open the lifeline's dedicated connection, retrying with back-off while the
    database is away."""
    operation = "worker connection"
    async for attempt in transient_retries(operation):
        with attempt:
            return await open_connection_async(
                url, application_name="jobsd-lifeline", operation=operation
            )
    raise AssertionError("unreachable: transient_retries never stops")


async def lock_worker(conn: AsyncConn, worker_id: str) -> int | None:
    """Try the worker's session lock; return this session's pid once taken, None while
    another session holds it."""
    with db_errors(f"lock of worker {worker_id!r}"):
        rows = await run_named(conn, "workers_lock", {"worker_id": worker_id})
    return int(rows[0]["pid"]) if rows[0]["locked"] else None


async def end_session(conn: AsyncConn, pid: int) -> bool:
    """End the daemon's own earlier lock session (``pid``) if it still lives; say
    whether one was ended."""
    with db_errors(f"end of the earlier lock session {pid}"):
        rows = await run_named(conn, "workers_end_session", {"pid": pid})
    return bool(rows[0]["ended"])


@dataclass(frozen=True, slots=True)
class TypeRule:
    """What a daemon's handler declares about its type, recorded in jobsd.job_types."""

    type: str
    delivery: str
    max_attempts: int


async def register_worker(
    conn: AsyncConn,
    worker_id: str,
    *,
    hostname: str,
    pid: int,
    lease_s: float,
    types: Sequence[str] | None = None,
    rules: Sequence[TypeRule] = (),
) -> None:
    """Insert the worker's row (or stamp it when it exists) with the types it claims
    (None: every type) and a lease of ``lease_s``, and record the rules of its types."""
    params = {
        "worker_id": worker_id,
        "lease_s": lease_s,
        "hostname": hostname,
        "pid": pid,
        "types": list(types) if types is not None else None,
        "rule_types": [r.type for r in rules],
        "rule_deliveries": [r.delivery for r in rules],
        "rule_max_attempts": [r.max_attempts for r in rules],
    }
    with db_errors(f"registration of worker {worker_id!r}"):
        await run_named(conn, "workers_register", params)


async def renew_worker(conn: AsyncConn, worker_id: str, *, lease_s: float) -> bool:
    """Renew the worker's lease for ``lease_s`` from now (the database's now); False
    when its row is gone (its death was declared, or the row deleted by hand)."""
    with db_errors(f"lease renewal of worker {worker_id!r}"):
        rows = await run_named(conn, "workers_renew", {"worker_id": worker_id, "lease_s": lease_s})
    return bool(rows)


async def deregister_worker(conn: AsyncConn, worker_id: str) -> None:
    """Delete the worker's row (a clean stop)."""
    with db_errors(f"deregistration of {worker_id!r}"):
        await run_named(conn, "workers_deregister", {"worker_id": worker_id})
