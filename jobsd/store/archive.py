"""archive.sql: the move of ended jobs into the archive, its months, and their drop."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobsd.store.db import AsyncConn, db_errors
from jobsd.store.named import run_named

__all__ = [
    "ArchiveMonth",
    "backlog",
    "drop_month",
    "ensure_ahead",
    "forget_orphans",
    "months",
    "move_batch",
]


@dataclass(frozen=True, slots=True)
class ArchiveMonth:
    """One month of the archive: its bounds' start and the jobs it holds by queue and type."""

    month: datetime
    partition: str
    events_partition: str
    contents: tuple[tuple[str, str, int], ...]
    """(queue, type, jobs) as the move counted them"""


async def move_batch(conn: AsyncConn, *, limit: int, min_age_s: float) -> int:
    """Move up to ``limit`` jobs that ended more than ``min_age_s`` ago; return how many."""
    with db_errors("archive move"):
        rows = await run_named(conn, "archive_move", {"limit": limit, "min_age_s": min_age_s})
    return int(rows[0]["moved"])


async def ensure_ahead(conn: AsyncConn, *, months: int) -> int:
    """Create the archive's months from this one to ``months`` ahead; return how many
    were missing."""
    with db_errors("archive months"):
        rows = await run_named(conn, "archive_ensure_ahead", {"months": months})
    return int(rows[0]["created"])


async def months(conn: AsyncConn) -> list[ArchiveMonth]:
    """Return the archive's months, oldest first."""
    with db_errors("archive months"):
        rows = await run_named(conn, "archive_months", {})
    return [
        ArchiveMonth(
            month=r["month"],
            partition=r["partition_name"],
            events_partition=r["events_partition_name"],
            contents=tuple((c["queue"], c["type"], int(c["jobs"])) for c in r["contents"]),
        )
        for r in rows
    ]


async def drop_month(conn: AsyncConn, month: datetime, *, lock_timeout_ms: int) -> bool:
    """Drop one month of the archive; False when it had no partition."""
    params = {"month": month, "lock_timeout_ms": lock_timeout_ms}
    with db_errors(f"drop of archive month {month:%Y-%m}"):
        rows = await run_named(conn, "archive_drop", params)
    return bool(rows[0]["dropped"])


async def forget_orphans(conn: AsyncConn, *, before: datetime, limit: int) -> dict[str, int]:
    """Delete up to ``limit`` dependency edges and on_fail records of jobs gone."""
    with db_errors("archive orphans"):
        rows = await run_named(conn, "archive_forget_orphans", {"before": before, "limit": limit})
    return {"edges": int(rows[0]["edges"]), "hooks": int(rows[0]["hooks"])}


async def backlog(conn: AsyncConn) -> dict[str, Any]:
    """Return the ended jobs still in the hot table and the oldest end among them."""
    with db_errors("archive backlog"):
        rows = await run_named(conn, "archive_backlog", {})
    return dict(rows[0])
