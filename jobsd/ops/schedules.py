"""List, pause and resume the periodic schedules: every org's, an operator's."""

from __future__ import annotations

from jobsd.ops.authority import Act, require
from jobsd.ops.caller import Caller
from jobsd.periodic import ScheduleInfo
from jobsd.store import schedules as store
from jobsd.store.db import AsyncConn

__all__ = ["list_schedules", "pause_schedule", "resume_schedule"]


async def list_schedules(conn: AsyncConn, caller: Caller) -> list[ScheduleInfo]:
    """Return every schedule with its last tick; Forbidden unless an operator."""
    require(caller, Act.ADMINISTER_QUEUES)
    return await store.info(conn)


async def pause_schedule(conn: AsyncConn, caller: Caller, schedule_id: str) -> ScheduleInfo:
    """Stop the schedule firing until resumed (idempotent); Forbidden, UnknownSchedule."""
    require(caller, Act.ADMINISTER_QUEUES)
    return await store.pause(conn, schedule_id)


async def resume_schedule(conn: AsyncConn, caller: Caller, schedule_id: str) -> ScheduleInfo:
    """Let the schedule fire from its next tick (idempotent); Forbidden, UnknownSchedule."""
    require(caller, Act.ADMINISTER_QUEUES)
    return await store.resume(conn, schedule_id)
