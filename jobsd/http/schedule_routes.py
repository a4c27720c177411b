"""The schedules endpoint: ``GET /schedules``, the periodic jobs and their last tick.

Schedules are shared by every org, so only admin tokens may read them, as the queues.
The read runs through the SECURITY DEFINER ``jobsd.schedule_info`` (migration 0013):
under the API's enqueue role it still sees the state of every org's last tick job.
Semantics in docs/periodic.md.
"""

# No `from __future__ import annotations` here: FastAPI reads the annotations of the
# endpoints at runtime, and `Admin` is local to `schedules_router`.

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from jobsd.http.backend import ApiBackend
from jobsd.http.problems import endpoint_name, responses, store_errors
from jobsd.http.schemas import ErrorOut
from jobsd.ops import Caller
from jobsd.ops.schedules import list_schedules as list_op

__all__ = ["ScheduleList", "ScheduleOut", "schedules_router"]


class ScheduleOut(BaseModel):
    """A periodic schedule, its state and its last tick."""

    id: str
    type: str
    org_id: str
    queue: str
    cron: str | None = Field(description="The cron expression; null for an interval.")
    every_s: float | None = Field(description="The interval in seconds; null for cron.")
    spec: str = Field(description="The cron expression, or `every 30s`.")
    timezone: str = Field(description="The zone the cron expression is read in.")
    catch_up: str = Field(description="latest, all or none: what missed ticks do.")
    paused: bool
    next_tick: datetime | None = Field(description="The next tick to fire; null while paused.")
    last_tick: datetime | None = Field(description="The newest tick fired (or refused).")
    last_job_id: str | None = Field(description="The job of the last tick.")
    last_state: str | None = Field(
        description="The state of that job, or `refused` when the enqueue was refused."
    )
    last_reason: str | None = Field(description="Why the last tick was refused.")
    fired: int = Field(description="Ticks that enqueued a job (or found its dedup holder).")
    refused: int = Field(description="Ticks whose enqueue was refused (full queue, ...).")
    late: int = Field(description="Ticks fired after they were missed (catch-up).")
    skipped: int = Field(description="Missed ticks the catch-up policy did not fire.")


class ScheduleList(BaseModel):
    """Every schedule, by id."""

    schedules: list[ScheduleOut]


def schedules_router(backend: ApiBackend, admin_dependency: Callable[..., Any]) -> APIRouter:
    """Build ``GET /schedules`` on ``backend``; ``admin_dependency`` admits admins only."""
    router = APIRouter(tags=["schedules"], generate_unique_id_function=endpoint_name)
    Admin = Annotated[str, Depends(admin_dependency)]

    @router.get(
        "/schedules",
        responses={
            403: {
                "model": ErrorOut,
                "description": "The token is not an admin token "
                "(`jobsd token create --org ORG --admin`).",
            },
            **responses(503),
        },
        summary="List the periodic schedules",
        description="Every schedule declared by a daemon, with its next tick, its last tick, "
        "that tick's job and state, and its counters.",
    )
    async def list_schedules(actor: Admin) -> ScheduleList:
        operation = "listing of the schedules"
        caller = Caller.as_operator(actor)  # the admin dependency admitted an operator
        with store_errors(operation):
            infos = await backend.read(operation, lambda conn: list_op(conn, caller))
        now = datetime.now(UTC)
        return ScheduleList(schedules=[ScheduleOut(**i.to_json(now)) for i in infos])

    return router
