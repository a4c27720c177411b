"""One typed function per named statement of ``sql/queries/retention.sql`` (``jobsd prune``).

Each statement is its own short transaction: on an autocommit connection it commits
by itself, on another one in a transaction of its own (``admin.retention`` refuses a
connection that is inside a transaction: a batch must never wait for the caller's).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from jobsd.store.db import AsyncConn, AsyncPool, acquire, db_errors
from jobsd.store.named import Row, run_named

__all__ = [
    "ArchiveScanBatch",
    "Policies",
    "ScanBatch",
    "archive_delete_batch",
    "archive_scan_batch",
    "connection_of",
    "delete_batch",
    "in_transaction",
    "read_policies",
    "scan_batch",
]


@dataclass(frozen=True, slots=True)
class Policies:
    """The clock of the whole prune, each queue's retention, and what the role may do."""

    now: datetime
    queues: dict[str, int | None]
    role: str
    rls_active: bool
    """Row-level security applies to the role: it would see one org's jobs only."""
    may_delete: bool


@dataclass(frozen=True, slots=True)
class ScanBatch:
    """One batch of the walk over the primary key: what was read and what is due."""

    scanned: int
    last_id: uuid.UUID | None
    ids: list[uuid.UUID]
    queues: list[str]
    """the queue of each due id, in the same order"""


@dataclass(frozen=True, slots=True)
class ArchiveScanBatch:
    """One batch of the walk over an archive month: what was read and what is due."""

    scanned: int
    last_at: datetime | None
    last_id: uuid.UUID | None
    ids: list[uuid.UUID]
    finished: list[datetime]
    queues: list[str]


@asynccontextmanager
async def connection_of(target: AsyncConn | AsyncPool, operation: str) -> AsyncIterator[AsyncConn]:
    """Yield ``target`` itself, or a connection taken from it when it is a pool."""
    if isinstance(target, AsyncConnectionPool):
        async with acquire(target, operation) as conn:
            yield conn
    else:
        yield target


def in_transaction(conn: AsyncConn) -> bool:
    """Say whether ``conn`` is inside a transaction (not idle)."""
    return conn.info.transaction_status != TransactionStatus.IDLE


async def _run(conn: AsyncConn, name: str, params: dict[str, Any]) -> list[Row]:
    """Run one statement as its own transaction, on an autocommit connection or not."""
    if conn.autocommit:
        return await run_named(conn, name, params)
    async with conn.transaction():
        return await run_named(conn, name, params)


async def read_policies(conn: AsyncConn, now: datetime | None) -> Policies:
    """Read the clock (``now``, else the database's), every queue's policy and the role."""
    with db_errors("prune: reading the retention policies"):
        rows = await _run(conn, "queues_retention", {"now": now})
    first = rows[0]
    return Policies(
        now=first["now"],
        queues={r["name"]: r["retention_days"] for r in rows if r["name"] is not None},
        role=first["role"],
        rls_active=bool(first["rls_active"]),
        may_delete=bool(first["may_delete"]),
    )


async def scan_batch(
    conn: AsyncConn, params: dict[str, Any], from_id: uuid.UUID, through_id: uuid.UUID
) -> ScanBatch:
    """Read the next batch of ids in ``[from_id, through_id]`` and return the due ones.

    ``params``: ``spare_types``, ``types`` and ``type_cutoffs``, ``queues`` and
    ``queue_cutoffs`` (parallel arrays), ``limit`` (the batch size).
    """
    with db_errors("prune: scanning for old jobs"):
        rows = await _run(
            conn, "jobs_prune_scan", {**params, "from_id": from_id, "through_id": through_id}
        )
    row = rows[0]
    return ScanBatch(row["scanned"], row["last_id"], list(row["ids"]), list(row["queues"]))


async def delete_batch(conn: AsyncConn, ids: list[uuid.UUID]) -> dict[str, int]:
    """Delete the due jobs of a batch that nobody holds; return the deleted per queue."""
    with db_errors(f"prune: deleting a batch of {len(ids)} jobs"):
        gone = await _run(conn, "jobs_prune_delete", {"ids": ids})
    return {g["queue"]: int(g["deleted"]) for g in gone}


async def archive_scan_batch(
    conn: AsyncConn,
    params: dict[str, Any],
    *,
    from_at: datetime,
    until_at: datetime,
    after_at: datetime,
    after_id: uuid.UUID,
) -> ArchiveScanBatch:
    """Read the next batch of archived jobs that ended in ``[from_at, until_at)`` after
    the keyset ``(after_at, after_id)``; return the due ones (``params`` as for
    ``scan_batch``)."""
    keys = {"from_at": from_at, "until_at": until_at, "after_at": after_at, "after_id": after_id}
    with db_errors("prune: scanning the archive"):
        rows = await _run(conn, "archive_prune_scan", {**params, **keys})
    row = rows[0]
    return ArchiveScanBatch(
        row["scanned"],
        row["last_at"],
        row["last_id"],
        list(row["ids"]),
        list(row["finished"]),
        list(row["queues"]),
    )


async def archive_delete_batch(
    conn: AsyncConn, ids: list[uuid.UUID], finished: list[datetime]
) -> dict[str, int]:
    """Delete due archived jobs (with their history); return the deleted per queue."""
    with db_errors(f"prune: deleting a batch of {len(ids)} archived jobs"):
        gone = await _run(conn, "archive_prune_delete", {"ids": ids, "finished": finished})
    return {g["queue"]: int(g["deleted"]) for g in gone}
