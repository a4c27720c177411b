"""handlers.sql: the on_fail hooks of failed jobs and the health of running jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jobsd.models import Job
from jobsd.store.db import AsyncConn, db_errors
from jobsd.store.named import run_named

__all__ = ["claim_fail_hooks", "running_health"]


async def claim_fail_hooks(
    conn: AsyncConn,
    *,
    types: list[str],
    worker_id: str,
    lookback_s: float,
    limit: int = 100,
    now: datetime | None = None,
) -> list[Job]:
    """Take on the on_fail hooks of failed jobs of ``types`` no daemon took yet; each
    job is returned to one caller only, ever."""
    if not types:
        return []
    params = {
        "types": types,
        "worker_id": worker_id,
        "lookback_s": lookback_s,
        "limit": limit,
        "now": now,
    }
    with db_errors("on_fail claim"):
        rows = await run_named(conn, "fail_hooks_claim", params)
    return [Job.from_row(r) for r in rows]


async def running_health(conn: AsyncConn) -> dict[str, Any]:
    """Return the oldest running job's age, the longest silence of a running job (time
    since its handler's last progress, or its start) in seconds, and the number of
    ``recovery_required`` jobs, every org's."""
    with db_errors("running health"):
        rows = await run_named(conn, "jobs_running_health", {})
    return dict(rows[0]) if rows else {}
