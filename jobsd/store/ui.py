"""One typed function per named query of ``sql/queries/ui.sql``: the dashboard's reads.

``org_id`` None reads every org (an admin); a string reads that org only, with
``jobsd.org_id`` set for row-level security (``store.api.run_for_org``). ``now`` None
is the database's clock.
Each read runs after ``ui_no_jit`` in the same transaction (JIT compilation costs far
more than these reads).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from jobsd.store.api import run_for_org
from jobsd.store.db import AsyncConn, db_errors
from jobsd.store.named import Row

_NO_JIT: list[tuple[str, dict[str, Any]]] = [("ui_no_jit", {})]


async def _read(
    conn: AsyncConn, org_id: str | None, name: str, params: dict[str, Any]
) -> list[Row]:
    return await run_for_org(conn, org_id, name, params, before=_NO_JIT)


async def open_counts_for_org(conn: AsyncConn, org_id: str) -> dict[str, dict[str, int]]:
    """Count one org's open jobs: queue -> state -> jobs."""
    with db_errors(f"counts of the jobs of org {org_id!r}"):
        rows = await _read(conn, org_id, "ui_open_counts_org", {"org_id": org_id})
    counts: dict[str, dict[str, int]] = {}
    for r in rows:
        counts.setdefault(r["queue"], {})[r["status"]] = int(r["jobs"])
    return counts


async def throughput(
    conn: AsyncConn, org_id: str | None, *, minutes: int = 60, now: datetime | None = None
) -> list[Row]:
    """Count finished jobs per queue and minute (``minutes_ago``) over the last ``minutes``."""
    params = {"org_id": org_id, "minutes": minutes, "now": now}
    with db_errors("throughput of the last hour"):
        return await _read(conn, org_id, "ui_throughput", params)


async def pickup_lag(
    conn: AsyncConn, org_id: str | None, *, now: datetime | None = None
) -> dict[str, float | None]:
    """Return, per queue, how long its longest-waiting next job has been due (None: none)."""
    with db_errors("pickup lag by queue"):
        rows = await _read(conn, org_id, "ui_pickup_lag", {"org_id": org_id, "now": now})
    return {
        r["queue"]: (max(float(r["lag_s"]), 0.0) if r["lag_s"] is not None else None) for r in rows
    }


async def workers(conn: AsyncConn) -> list[Row] | None:
    """List the registered daemons with the jobs each holds; None when the connection's
    role may not read ``jobsd.workers`` (the enqueue and read roles)."""
    with db_errors("listing of the daemons"):
        try:
            return await _read(conn, None, "ui_workers", {})
        except psycopg.errors.InsufficientPrivilege:
            return None


async def recent_failures(conn: AsyncConn, org_id: str | None, *, limit: int = 10) -> list[Row]:
    """List the latest failed jobs, newest first."""
    with db_errors("listing of recent failures"):
        return await _read(conn, org_id, "ui_recent_failures", {"org_id": org_id, "limit": limit})


# the per-type figures: no JIT, and a plan made for the filters given (ui_stats_setup)
_STATS_SETUP: list[tuple[str, dict[str, Any]]] = [("ui_stats_setup", {})]


async def type_figures(
    conn: AsyncConn, org_id: str | None, type: str | None, *, now: datetime | None = None
) -> list[Row]:
    """Count what ended over the last hour (``span`` 'hour', by ``minutes_ago``) and day
    ('day') per type and run-duration bucket (``ui_type_figures``); ``org_id``, ``type``:
    None for any."""
    params = {"org_id": org_id, "type": type, "now": now}
    with db_errors("figures by job type"):
        return await run_for_org(conn, org_id, "ui_type_figures", params, before=_STATS_SETUP)
