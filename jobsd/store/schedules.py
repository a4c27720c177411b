"""One typed function per named statement of ``sql/queries/schedules.sql``: periodic jobs.

``fire_tick`` is the heart: in one transaction it takes the tick (the primary key of
``jobsd.schedule_ticks`` lets one scheduler have it, whatever the number of them),
enqueues its job through the normal plan (queue, capacity, keys, dedup) inside a
savepoint, and records the outcome. A refused enqueue is an outcome too: the tick is
taken, counted as refused, and never retried.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from jobsd.errors import (
    DuplicateJob,
    InvalidPayload,
    QueueFull,
    UnknownQueue,
    UnknownSchedule,
)
from jobsd.jobspec import JobSpec
from jobsd.models import Job
from jobsd.periodic import ScheduleInfo
from jobsd.store.db import AsyncConn, db_errors
from jobsd.store.enqueue import enqueue
from jobsd.store.named import run_named

__all__ = [
    "ScheduleState",
    "TickOutcome",
    "fire_tick",
    "info",
    "pause",
    "resume",
    "skip",
    "state",
    "upsert",
]

# What refuses a tick's enqueue: flow control and bad input. Anything else (the
# database away, a bug) is not a refusal: the transaction is rolled back, the tick
# stays free and the next pass tries it again.
_REFUSALS = (QueueFull, UnknownQueue, InvalidPayload, DuplicateJob)


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """What a scheduler pass reads of one schedule."""

    id: str
    paused: bool
    since: datetime
    """ticks at or before this never fire (created, resumed, last tick, skipped)"""


@dataclass(frozen=True, slots=True)
class TickOutcome:
    """What the tick taken by this scheduler did."""

    outcome: Literal["enqueued", "existing", "refused"]
    job: Job | None
    reason: str | None


async def upsert(conn: AsyncConn, rows: Sequence[dict[str, Any]], now: datetime | None) -> None:
    """Declare schedules or update their definitions, in one transaction."""
    with db_errors("declaration of the schedules"):
        async with conn.transaction():
            for row in rows:
                await run_named(conn, "schedules_upsert", {**row, "now": now})


async def state(
    conn: AsyncConn, ids: Sequence[str], now: datetime | None
) -> tuple[datetime, list[ScheduleState]]:
    """Return the database's time (or ``now``) and the state of the schedules ``ids``."""
    with db_errors("read of the schedules"):
        rows = await run_named(conn, "schedules_state", {"ids": list(ids), "now": now})
    states = [ScheduleState(r["id"], r["paused"], r["since"]) for r in rows if r["id"]]
    return rows[0]["now"], states


async def fire_tick(
    conn: AsyncConn,
    *,
    schedule_id: str,
    tick: datetime,
    late: bool,
    spec: JobSpec,
    worker_id: str,
    now: datetime | None,
) -> TickOutcome | None:
    """Take ``tick`` and enqueue its job; None when another scheduler had it already.

    Raises BackendUnavailable, DatabaseError: then nothing is written.
    """
    operation = f"tick {tick.isoformat()} of schedule {schedule_id!r}"
    key = {"id": schedule_id, "tick": tick}
    with db_errors(operation):
        async with conn.transaction():
            taken = await run_named(
                conn,
                "schedule_ticks_claim",
                {**key, "late": late, "worker_id": worker_id, "now": now},
            )
            if not taken:
                return None
            job: Job | None = None
            reason: str | None = None
            try:
                async with conn.transaction():  # a savepoint: a refusal keeps the tick
                    job = await enqueue(conn, spec)
            except _REFUSALS as exc:
                reason = str(exc)
            if job is None:
                outcome: Literal["enqueued", "existing", "refused"] = "refused"
            else:
                outcome = "enqueued" if job.id == spec.id else "existing"
            await run_named(
                conn,
                "schedule_ticks_settle",
                {
                    **key,
                    "outcome": outcome,
                    "job_id": job.id if job is not None else None,
                    "reason": reason,
                    "late": late,
                },
            )
    return TickOutcome(outcome, job, reason)


async def skip(conn: AsyncConn, schedule_id: str, count: int, until: datetime) -> bool:
    """Count ``count`` missed ticks up to ``until`` as skipped, once; True if this call did."""
    with db_errors(f"skip of missed ticks of schedule {schedule_id!r}"):
        rows = await run_named(
            conn, "schedules_skip", {"id": schedule_id, "count": count, "until": until}
        )
    return bool(rows)


async def info(conn: AsyncConn, schedule_id: str | None = None) -> list[ScheduleInfo]:
    """Return every schedule (or the one of ``schedule_id``), by id."""
    what = "listing of the schedules" if schedule_id is None else f"read of {schedule_id!r}"
    with db_errors(what):
        rows = await run_named(conn, "schedules_info", {"id": schedule_id})
    return [ScheduleInfo.from_row(r) for r in rows]


async def _set_paused(
    conn: AsyncConn, statement: str, schedule_id: str, now: datetime | None, verb: str
) -> ScheduleInfo:
    with db_errors(f"{verb} of schedule {schedule_id!r}"):
        async with conn.transaction():
            rows = await run_named(conn, statement, {"id": schedule_id, "now": now})
            if not rows:
                raise UnknownSchedule(schedule_id)
            found = await run_named(conn, "schedules_info", {"id": schedule_id})
    return ScheduleInfo.from_row(found[0])


async def pause(conn: AsyncConn, schedule_id: str, now: datetime | None = None) -> ScheduleInfo:
    """Stop a schedule firing (persisted); raise UnknownSchedule."""
    return await _set_paused(conn, "schedules_pause", schedule_id, now, "pause")


async def resume(conn: AsyncConn, schedule_id: str, now: datetime | None = None) -> ScheduleInfo:
    """Let a schedule fire again from its next tick; raise UnknownSchedule."""
    return await _set_paused(conn, "schedules_resume", schedule_id, now, "resume")
