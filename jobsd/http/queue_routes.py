"""The queue endpoints: declare, list, read, change, pause, resume and drop queues.

Queues are shared by every org, so only admin tokens (``jobsd token create --admin``)
may use these endpoints: another token gets 403. The work is ``jobsd.admin.queues``, through
the SECURITY DEFINER functions of migration 0009: it runs under the API's enqueue
role, and the depth of a queue counts every org's jobs. Semantics in docs/queues.md.
"""

# No `from __future__ import annotations` here: FastAPI reads the annotations of the
# endpoints at runtime, and `Admin` is local to `queues_router`.

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from jobsd.admin import queues
from jobsd.errors import QueueExists, UnknownQueue
from jobsd.http.auth import TOKEN_ID_STATE
from jobsd.http.backend import ApiBackend
from jobsd.http.problems import endpoint_name, problem, responses, store_errors
from jobsd.http.schemas import QUEUE_PATTERN, ErrorOut, Problem, QueueName
from jobsd.ops import AsyncConn, Caller
from jobsd.ops import queues as queue_ops

__all__ = [
    "QueueDepth",
    "QueueDropped",
    "QueueIn",
    "QueueList",
    "QueueOut",
    "QueuePatch",
    "queues_router",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

_INT_MAX = 2**31 - 1  # the limits are Postgres integers
Capacity = Annotated[int, Field(ge=1, le=_INT_MAX, description="Open jobs at most.")]
ConcurrencyLimit = Annotated[
    int, Field(ge=1, le=_INT_MAX, description="Running jobs of one concurrency key at most.")
]
RetentionDays = Annotated[
    int, Field(ge=0, le=_INT_MAX, description="Days `jobsd prune` keeps finished jobs.")
]
QueuePath = Annotated[str, Path(pattern=QUEUE_PATTERN, description="The queue's name.")]


class QueueIn(BaseModel):
    """A queue to declare; a limit left out (or null) is unset."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"name": "mail"},
                {"name": "reports", "capacity": 1000, "concurrency_limit": 2, "retention_days": 30},
            ]
        },
    )

    name: QueueName = Field(description="1 to 63 letters, digits and _ . : - (not first).")
    capacity: Capacity | None = None
    concurrency_limit: ConcurrencyLimit | None = None
    retention_days: RetentionDays | None = None


class QueuePatch(BaseModel):
    """New limits: a field left out stays as it is; null removes the limit."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"capacity": 500}, {"capacity": None, "retention_days": 7}]
        },
    )

    capacity: Capacity | None = None
    concurrency_limit: ConcurrencyLimit | None = None
    retention_days: RetentionDays | None = None


class QueueDepth(BaseModel):
    """Open jobs of the queue by state, every org's."""

    queued: int
    scheduled: int
    blocked: int
    running: int
    recovery_required: int


class QueueOut(BaseModel):
    """A declared queue."""

    name: str
    paused: bool = Field(description="No claims from the queue while true.")
    paused_at: datetime | None = Field(description="When the queue was paused.")
    capacity: int | None = Field(description="Open jobs at most; null: no capacity.")
    concurrency_limit: int | None = Field(
        description="Running jobs of one concurrency key at most; null: the default."
    )
    retention_days: int | None = Field(
        description="Days finished jobs are kept; null: until deleted."
    )
    created_at: datetime
    depth: QueueDepth

    @classmethod
    def from_info(cls, info: queues.QueueInfo) -> "QueueOut":
        """Build from a ``QueueInfo`` (its fields and properties of the same names)."""
        return cls.model_validate(info, from_attributes=True)


class QueueList(BaseModel):
    """Every declared queue, by name."""

    queues: list[QueueOut]


class QueueDropped(BaseModel):
    """A dropped queue and how many finished jobs went with it."""

    name: str
    deleted_jobs: int = Field(description="Finished jobs deleted with the queue (every org's).")


class QueueProblem(Problem):
    """What went wrong with a queue."""

    open_jobs: int | None = Field(
        default=None, description="With queue_not_empty: the queue's unfinished jobs."
    )


class QueueErrorOut(BaseModel):
    """An error answer about a queue."""

    detail: QueueProblem


_ANSWERS: dict[int, str] = {
    403: "The token is not an admin token (`jobsd token create --org ORG --admin`).",
    404: "No such queue.",
}


def _answers(*codes: int, conflict: str | None = None) -> dict[int | str, dict[str, Any]]:
    declared: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        declared[code] = {"model": ErrorOut, "description": _ANSWERS[code]}
    if conflict is not None:
        declared[409] = {"model": QueueErrorOut, "description": conflict}
    return {**declared, **responses(503)}


def _not_found(name: str) -> Exception:
    return problem(404, "queue_not_found", f"queue {name!r} not found")


def queues_router(backend: ApiBackend, admin_dependency: Callable[..., Any]) -> APIRouter:
    """Build the queue endpoints on ``backend``; ``admin_dependency`` admits admins only."""
    router = APIRouter(tags=["queues"], generate_unique_id_function=endpoint_name)
    Admin = Annotated[str, Depends(admin_dependency)]

    async def run(
        operation: str,
        fn: Callable[[AsyncConn], Awaitable[T]],
        *,
        queue: str | None = None,
        repeatable: bool = True,
        actor: str | None = None,
    ) -> T:
        """Run ``fn(conn)``; with ``queue``, an unknown queue is a 404.

        A read or an idempotent change (``repeatable``) is retried once on a dropped
        connection; a change that must not be repeated blindly (create, drop) runs on
        one connection. A change names its ``actor`` for the audit (admin_actions).
        """
        work = fn

        if actor is not None:
            who = actor

            async def work(conn: AsyncConn) -> T:
                return await queues.as_actor(conn, who, fn)

        try:
            with store_errors(operation):
                if repeatable:
                    return await backend.read(operation, work)
                return await backend.once(operation, work)
        except UnknownQueue as exc:
            if queue is None:
                raise
            raise _not_found(queue) from exc

    def audit(event: str, name: str, actor: str, request: Request, **extra: Any) -> None:
        token_id = getattr(request.state, TOKEN_ID_STATE, None)
        log.info(event, extra={"queue": name, "actor": actor, "token_id": token_id, **extra})

    @router.get(
        "/queues",
        responses=_answers(403),
        summary="List the queues",
        description="Every declared queue, with its limits, whether it is paused, and its "
        "open jobs by state (every org's).",
    )
    async def list_queues(actor: Admin) -> QueueList:
        infos = await run("listing of the queues", queues.list_queues)
        return QueueList(queues=[QueueOut.from_info(i) for i in infos])

    @router.post(
        "/queues",
        status_code=201,
        responses=_answers(403, conflict="A queue of that name exists already."),
        summary="Declare a queue",
        description="201 with the queue; 409 `queue_exists` if the name is taken (nothing "
        "changes: use PATCH to change its limits).",
    )
    async def create_queue(body: QueueIn, actor: Admin, request: Request) -> QueueOut:
        try:
            info = await run(
                f"creation of queue {body.name!r}",
                lambda conn: queues.create_queue(
                    conn,
                    body.name,
                    capacity=body.capacity,
                    concurrency_limit=body.concurrency_limit,
                    retention_days=body.retention_days,
                ),
                repeatable=False,
                actor=actor,
            )
        except QueueExists as exc:
            raise problem(409, "queue_exists", str(exc)) from exc
        audit("api.queue_created", body.name, actor, request)
        return QueueOut.from_info(info)

    @router.get(
        "/queues/{name}",
        responses=_answers(403, 404),
        summary="Read a queue",
    )
    async def get_queue(name: QueuePath, actor: Admin) -> QueueOut:
        info = await run(
            f"read of queue {name!r}", lambda conn: queues.get_queue(conn, name), queue=name
        )
        return QueueOut.from_info(info)

    @router.patch(
        "/queues/{name}",
        responses=_answers(403, 404),
        summary="Change a queue's limits",
        description="A field left out stays as it is; null removes the limit. A capacity "
        "below the queue's open jobs is accepted: submissions are refused until fewer "
        "jobs than the capacity are open.",
    )
    async def set_queue_limits(
        name: QueuePath, body: QueuePatch, actor: Admin, request: Request
    ) -> QueueOut:
        given = body.model_fields_set
        changes: dict[str, Any] = {field: getattr(body, field) for field in given}
        info = await run(
            f"change of the limits of queue {name!r}",
            lambda conn: queues.set_queue_limits(conn, name, **changes),
            queue=name,
            actor=actor,
        )
        if given:
            audit(
                "api.queue_limits_set",
                name,
                actor,
                request,
                **{f: getattr(body, f) for f in sorted(given)},
            )
        return QueueOut.from_info(info)

    def switch(
        action: str,
        change: Callable[[AsyncConn, Caller, str], Awaitable[queues.QueueInfo]],
        summary: str,
        description: str,
    ) -> None:
        """Add ``POST /queues/{name}/<action>`` (pause, resume): idempotent, audited."""

        @router.post(
            f"/queues/{{name}}/{action}",
            responses=_answers(403, 404),
            name=f"{action}_queue",
            summary=summary,
            description=description,
        )
        async def endpoint(name: QueuePath, actor: Admin, request: Request) -> QueueOut:
            caller = Caller.as_operator(actor)  # the admin dependency admitted an operator
            info = await run(
                f"{action} of queue {name!r}", lambda c: change(c, caller, name), queue=name
            )
            audit(f"api.queue_{action}d", name, actor, request)
            return QueueOut.from_info(info)

    switch(
        "pause",
        queue_ops.pause_queue,
        summary="Pause a queue",
        description="No job of the queue is claimed from now on; running jobs finish. "
        "Pausing a paused queue keeps its first paused_at.",
    )
    switch(
        "resume",
        queue_ops.resume_queue,
        summary="Resume a queue",
        description="Daemons claim from the queue again, woken at once by a notification. "
        "Resuming a queue that is not paused changes nothing.",
    )

    @router.delete(
        "/queues/{name}",
        responses=_answers(403),
        summary="Drop a queue (refused: `jobsd queue drop`)",
        description="Dropping a queue deletes every org's finished jobs in it: it is the "
        "owner's, on the command line (`jobsd queue drop NAME`). Through the API it is "
        "always refused: 403 `cli_only`, nothing deleted.",
    )
    async def drop_queue(name: QueuePath, actor: Admin, request: Request) -> QueueDropped:
        audit("api.queue_drop_refused", name, actor, request)
        raise problem(
            403,
            "cli_only",
            f"the queue {name!r} was not dropped: dropping a queue deletes every org's "
            "finished jobs and is done on the command line, as the owner: `jobsd queue drop`",
        )

    return router
