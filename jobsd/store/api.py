"""One typed function per named query of ``sql/queries/api.sql`` (jobs as one org sees them).

Every function takes a connection from the API's pool and translates psycopg errors
with ``db_errors``, naming the operation and the id. Every query on jobs runs through
``run_for_org``: the org goes into ``jobsd.org_id`` in the same implicit transaction,
so row-level security (migration 0003) backs up the ``WHERE org_id`` of each query
when the API runs as the enqueue or the read role. The API's submit and cancel use
``run_for_org`` too (``store.enqueue``, ``store.jobs_ops``).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobsd.store.db import AsyncConn, SyncConn, db_errors
from jobsd.store.named import Row, run_named, run_named_sync, sql_text

__all__ = [
    "Cursor",
    "QueueAge",
    "done_notify_key",
    "done_payload",
    "health_row",
    "ping",
    "queue_depth",
    "queue_oldest_age",
    "role_bypass",
    "run_for_org",
    "run_for_org_sync",
    "unhandled_jobs",
]

_PIPELINE = psycopg.AsyncPipeline.is_supported()


async def done_notify_key(conn: AsyncConn) -> str:
    """Return the key of the done-notifications' payloads (``md5(key || id)``)."""
    with db_errors("read of the done-notification key"):
        rows = await run_named(conn, "api_done_notify_key", {})
    return str(rows[0]["key"])


def done_payload(key: str, job_id: uuid.UUID) -> str:
    """Return the payload the database sends on ``jobsd_done`` when ``job_id`` ends."""
    return hashlib.md5(f"{key}{job_id}".encode("ascii"), usedforsecurity=False).hexdigest()


async def role_bypass(conn: AsyncConn) -> tuple[str, str]:
    """Return the connection's role and what lets it past row-level security ('' if nothing)."""
    with db_errors("role check"):
        rows = await run_named(conn, "api_role_bypass", {})
    return str(rows[0]["role"]), str(rows[0]["bypass"] or "")


async def run_for_org(
    conn: AsyncConn,
    org_id: str | None,
    name: str,
    params: dict[str, Any],
    *,
    before: Sequence[tuple[str, dict[str, Any]]] = (),
) -> list[Row]:
    """Run a named query with ``jobsd.org_id`` set to ``org_id``, in one round trip.

    ``org_id`` None sets no org: for the owner and worker roles, which see every
    org's jobs (an operator's cancel). ``api_set_org``, the ``before`` statements
    (e.g. ``admin_set_actor``) and the query are pipelined and
    followed by one Sync: Postgres runs them in one implicit transaction, which
    commits at the Sync. The transaction-local setting ends with it, so a pooled
    connection never carries an org into the next request. ``conn`` is idle
    (autocommit, no transaction open), or inside a transaction the caller opened
    (an enqueue with dependencies): then the setting lasts until that transaction
    ends. Any error rolls all of it back.
    """
    if org_id is not None and not org_id:
        raise ValueError("org must be a non-empty string")
    async with conn.cursor(row_factory=dict_row) as cur:
        # Without pipeline support (a libpq older than 14): an explicit transaction,
        # same effect, three more round trips.
        scope = conn.pipeline() if _PIPELINE else conn.transaction()
        async with scope:
            if org_id is not None:
                await conn.execute(sql_text("api_set_org"), {"org_id": org_id})
            for setup, setup_params in before:
                await conn.execute(sql_text(setup), setup_params)
            await cur.execute(sql_text(name), params)
        return await cur.fetchall() if cur.description else []


def run_for_org_sync(
    conn: SyncConn, org_id: str | None, name: str, params: dict[str, Any]
) -> list[Row]:
    """Run a named query with ``jobsd.org_id`` set, in one transaction; see
    ``run_for_org`` (sync)."""
    if org_id is not None and not org_id:
        raise ValueError("org must be a non-empty string")
    with conn.transaction():
        if org_id is not None:
            run_named_sync(conn, "api_set_org", {"org_id": org_id})
        return run_named_sync(conn, name, params)


@dataclass(frozen=True, slots=True)
class Cursor:
    """A keyset position in the newest-first list: the last job shown."""

    created_at: datetime
    id: uuid.UUID


async def _bounded(
    conn: AsyncConn,
    operation: str,
    name: str,
    timeout_s: float,
    params: dict[str, Any] | None = None,
) -> list[Row]:
    """Run statement ``name`` under a statement timeout; its errors name ``operation``."""
    with db_errors(operation):
        async with conn.transaction():
            timeout_ms = str(max(int(timeout_s * 1000), 1))
            await run_named(conn, "api_set_statement_timeout", {"timeout_ms": timeout_ms})
            return await run_named(conn, name, params or {})


async def queue_depth(conn: AsyncConn, *, timeout_s: float) -> list[tuple[str, str, int]]:
    """Count queued, scheduled, running and recovery_required jobs by queue (zeros
    included)."""
    rows = await _bounded(conn, "queue depth", "api_jobs_depth", timeout_s)
    return [(r["queue"], r["status"], int(r["jobs"])) for r in rows]


@dataclass(frozen=True, slots=True)
class QueueAge:
    """How long a queue's oldest due job not yet started has waited."""

    queue: str
    paused: bool
    """its jobs wait on purpose (``jobsd queue pause``)"""
    age_s: float
    """seconds since it became due; 0 when the queue has no such job"""


async def queue_oldest_age(
    conn: AsyncConn, *, timeout_s: float, now: datetime | None = None
) -> list[QueueAge]:
    """Return each declared queue's oldest wait, every org's (``now`` None: the
    database's clock)."""
    rows = await _bounded(
        conn, "oldest queued age", "api_queue_oldest_age", timeout_s, {"now": now}
    )
    return [QueueAge(r["queue"], bool(r["paused"]), max(float(r["age_s"]), 0.0)) for r in rows]


async def health_row(conn: AsyncConn, *, timeout_s: float) -> Row:
    """Read the health report's figures (see ``api_health_report``)."""
    rows = await _bounded(conn, "health report", "api_health_report", timeout_s)
    row = dict(rows[0]) if rows else {}
    for key in (
        "oldest_queued_age_s",
        "oldest_xact_age_s",
        "oldest_prepared_xact_age_s",
        "oldest_running_age_s",
        "oldest_running_idle_s",
    ):
        if row.get(key) is not None:
            row[key] = max(float(row[key]), 0.0)
    return row


async def unhandled_jobs(conn: AsyncConn, *, timeout_s: float) -> list[tuple[str, str, int]]:
    """Count queued jobs of types no live daemon handles, by queue and type (every org's)."""
    rows = await _bounded(conn, "count of unhandled jobs", "jobs_unhandled", timeout_s)
    return [(r["queue"], r["type"], int(r["jobs"])) for r in rows]


async def notify_queue_usage(conn: AsyncConn, *, timeout_s: float) -> float:
    """Return the share of the cluster's NOTIFY queue in use (0 to 1)."""
    rows = await _bounded(conn, "notify queue usage", "api_notify_queue_usage", timeout_s)
    return float(rows[0]["usage"]) if rows else 0.0


async def ping(conn: AsyncConn) -> bool:
    """Run a trivial query."""
    with db_errors("ping"):
        rows = await run_named(conn, "api_ping", {})
    return bool(rows)
