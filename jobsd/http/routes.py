"""The jobs endpoints: submit, read (and long-poll), list, cancel, retry, resolve; every
one scoped by org.

The org comes from a dependency: the bearer token in jobsd's own app, or whatever the
host application already knows when it mounts ``jobsd.http.router(org_dependency=...)``.
Every operation on an existing job is ``jobsd.ops``'s, called as that org's caller;
its refusals become answers through one table (``problems.refused``).

The listing and a read without ``wait`` may be answered by the read replica
(``ApiBackend.read_lagging``); such an answer carries ``X-Jobsd-Replica-Lag``, the
replica's delay in seconds. A long-poll and every change read the primary.
"""

# No `from __future__ import annotations` here: FastAPI reads the annotations of the
# endpoints at runtime, and `Org` is local to `jobs_router`.

import base64
import binascii
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import APIRouter, Depends, Query, Request, Response

from jobsd.errors import (
    BackendUnavailable,
    DatabaseError,
    DuplicateJob,
    InvalidPayload,
    JobsdError,
    OrgQuotaExceeded,
    PayloadTooLarge,
    QueueFull,
    UnknownDependency,
    UnknownQueue,
)
from jobsd.http.auth import TOKEN_ID_STATE
from jobsd.http.backend import ApiBackend, Lagged
from jobsd.http.problems import (
    database_error,
    db_unavailable,
    endpoint_name,
    field_error,
    problem,
    rate_limited,
    refusal,
    refused,
    responses,
    store_errors,
)
from jobsd.http.schemas import (
    CursorText,
    JobDetail,
    JobIn,
    JobOut,
    JobPage,
    JobSummary,
    QueueFilter,
    ResolveIn,
    TypeFilter,
)
from jobsd.http.settings import HttpSettings
from jobsd.ids import uuid7
from jobsd.jobspec import JobSpec
from jobsd.models import JobStatus
from jobsd.ops import AsyncConn, Caller
from jobsd.ops.cancel import cancel_job as cancel_op
from jobsd.ops.get import get_job as get_op
from jobsd.ops.get import job_status
from jobsd.ops.listing import Cursor
from jobsd.ops.listing import list_jobs as list_op
from jobsd.ops.resolve import resolve_job as resolve_op
from jobsd.ops.retry import retry_job as retry_op

__all__ = [
    "REPLICA_LAG_HEADER",
    "client_key",
    "decode_cursor",
    "encode_cursor",
    "jobs_router",
    "lag_header",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_PAGE = 200

REPLICA_LAG_HEADER = "X-Jobsd-Replica-Lag"
"""On an answer read from the read replica: its delay behind the primary, in seconds
(``0.250``), or ``unknown``; absent from an answer read on the primary."""


def lag_header(served: Lagged[Any]) -> dict[str, str]:
    """Return the ``X-Jobsd-Replica-Lag`` header of an answer (none: read on the primary)."""
    if not served.replica:
        return {}
    lag_s = served.lag_s
    return {REPLICA_LAG_HEADER: "unknown" if lag_s is None else f"{lag_s:.3f}"}


def encode_cursor(created_at: datetime, job_id: uuid.UUID) -> str:
    """Return the opaque cursor that resumes a listing after this job."""
    raw = f"{created_at.isoformat()}|{job_id}".encode("ascii")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> Cursor:
    """Read a cursor made by ``encode_cursor``; raise ValueError for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        when, _, job_id = raw.partition("|")
        created_at = datetime.fromisoformat(when)
        if created_at.tzinfo is None:
            raise ValueError("naive time")
        return Cursor(created_at, uuid.UUID(job_id))
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise ValueError("invalid cursor: send next_cursor from the previous page") from exc


def jobs_router(
    backend: ApiBackend, caller_dependency: Callable[..., Any], *, with_lifespan: bool
) -> APIRouter:
    """Build the jobs endpoints on ``backend``; ``caller_dependency`` returns the ``Caller``:
    an org's (an org's token, or the host application's org), or an operator's (an
    operator token: every org's jobs, and no submission, which needs an org).

    With ``with_lifespan`` the router carries the backend's lifespan, which FastAPI
    merges into the lifespan of the app that includes it.
    """
    router = APIRouter(
        tags=["jobs"],
        lifespan=backend.lifespan if with_lifespan else None,
        generate_unique_id_function=endpoint_name,
    )
    Who = Annotated[Caller, Depends(caller_dependency)]

    @router.post(
        "/jobs",
        status_code=202,
        responses=responses(409, 413, 429, 503),
        summary="Submit a job",
        description="Answers 202 once the job is committed, whatever the workers are doing. "
        "With a client `id`, a retried submission returns the same job, never a second one; "
        "with a `dedup_key` held by a pending job of the org, that job is returned. "
        "Over the token's submission rate (JOBSD_SUBMIT_RATE): 429 with Retry-After, "
        "and nothing is written; into a queue holding its capacity of open jobs: 429 "
        "with code queue_full, and nothing is written.",
    )
    async def submit_job(body: JobIn, caller: Who, request: Request, response: Response) -> JobOut:
        org_id = _org_of(caller)
        job_id = body.id or uuid7()
        _check_fair(body, backend.http)
        _limit_submissions(backend, request, caller)
        try:
            spec = JobSpec.build(
                body.type,
                body.payload,
                org_id=org_id,
                max_payload_bytes=backend.settings.max_payload_bytes,
                **body.options(job_id),
            )
        except PayloadTooLarge as exc:
            raise problem(413, "payload_too_large", str(exc)) from exc
        except InvalidPayload as exc:
            raise field_error(("body", "payload"), str(exc), "invalid_payload") from exc
        except ValueError as exc:  # e.g. a job that depends on itself
            raise field_error(
                ("body", "depends_on"), str(exc), "invalid_dependency", body.depends_on
            ) from exc
        try:
            job = await backend.submit(spec)
        except QueueFull as exc:
            event = "api.org_quota" if isinstance(exc, OrgQuotaExceeded) else "api.queue_full"
            log.info(event, extra={"queue": exc.queue, "org_id": org_id})
            raise refused(exc) from exc
        except UnknownDependency as exc:
            raise field_error(
                ("body", "depends_on"), str(exc), "unknown_dependency", exc.job_ids
            ) from exc
        except UnknownQueue as exc:
            raise field_error(("body", "queue"), str(exc), "unknown_queue", body.queue) from exc
        except PayloadTooLarge as exc:
            raise problem(413, "payload_too_large", str(exc)) from exc
        except InvalidPayload as exc:
            raise field_error(("body", "payload"), str(exc), "invalid_payload") from exc
        except DuplicateJob as exc:
            raise problem(
                409, "id_in_use", f"job id {job_id} is already in use: choose another id"
            ) from exc
        except BackendUnavailable as exc:
            log.warning("api.submit_unavailable", extra={"job_id": job_id, "error": str(exc)})
            raise db_unavailable(exc, job_id=job_id) from exc
        except DatabaseError as exc:
            log.error("api.submit_failed", extra={"job_id": job_id}, exc_info=True)
            raise database_error(exc) from exc
        response.headers["Location"] = str(request.url_for("get_job", job_id=str(job.id)))
        return JobOut.from_job(job)

    @router.get(
        "/jobs",
        responses=responses(429, 503),
        summary="List the org's jobs, newest first",
        description="Keyset-paginated: send `next_cursor` as `cursor` for the next page. "
        "Items leave out payload and report (read them with GET /jobs/{job_id}).",
    )
    async def list_jobs(
        caller: Who,
        request: Request,
        response: Response,
        status: Annotated[JobStatus | None, Query(description="Only this state.")] = None,
        type: Annotated[TypeFilter | None, Query(description="Only this type.")] = None,
        queue: Annotated[QueueFilter | None, Query(description="Only this queue.")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Page size.")] = 50,
        cursor: Annotated[
            CursorText | None, Query(description="`next_cursor` of the previous page.")
        ] = None,
    ) -> JobPage:
        _limit_reads(backend, request, caller)
        after = None
        if cursor is not None:
            try:
                after = decode_cursor(cursor)
            except ValueError as exc:
                raise field_error(("query", "cursor"), str(exc), "invalid_cursor", cursor) from exc
        with store_errors("job listing"):
            served = await backend.read_lagging(
                "job listing",
                lambda conn: list_op(
                    conn, caller, after=after, status=status, type=type, queue=queue, limit=limit
                ),
            )
        response.headers.update(lag_header(served))
        page = served.value
        jobs = [JobSummary.from_job(j) for j in page.jobs]
        more = page.next
        next_cursor = encode_cursor(more.created_at, more.id) if more else None
        return JobPage(jobs=jobs, next_cursor=next_cursor)

    @router.get(
        "/jobs/{job_id}",
        responses=responses(404, 429, 503),
        summary="Read a job and its history",
        description="The job, its history (oldest change first) and the errors of its last "
        "attempts that ended in one (`errors`, at most 10, most recent first). With "
        "`wait=S`, answers as soon as the job is terminal (succeeded, failed, "
        "cancelled), woken by a database notification, or after S seconds (capped by "
        "JOBSD_LONGPOLL_MAX) with the current state. Over the token's read rate "
        "(JOBSD_READ_RATE), or with too many long-polls open (JOBSD_LONGPOLL_MAX_CONCURRENT "
        "in all, JOBSD_LONGPOLL_MAX_PER_TOKEN per token; code too_many_waits): 429 with "
        "Retry-After.",
    )
    async def get_job(
        job_id: uuid.UUID,
        caller: Who,
        request: Request,
        response: Response,
        wait: Annotated[
            float | None,
            Query(ge=0, allow_inf_nan=False, description="Long-poll for up to this many seconds."),
        ] = None,
    ) -> JobDetail:
        key = _limit_reads(backend, request, caller)
        operation = f"read of job {job_id}"
        if wait:
            with backend.longpolls.hold(key) as admitted:
                if not admitted:
                    raise _too_many_waits(backend)
                timeout_s = min(wait, backend.http.longpoll_max)
                with store_errors(f"status of job {job_id}"):
                    await _wait_terminal(backend, job_id, caller, timeout_s)
                async with backend.longpoll_reads:
                    view = await _operate(backend, operation, lambda c: get_op(c, caller, job_id))
        else:  # may lag: the replica's answer (a job it lacks is read on the primary)
            with _answering(operation):
                served = await backend.read_lagging(operation, lambda c: get_op(c, caller, job_id))
            response.headers.update(lag_header(served))
            view = served.value
        return JobDetail.from_view(view)

    @router.post(
        "/jobs/{job_id}/cancel",
        responses={
            **responses(404, 409, 503),
            202: {
                "model": JobOut,
                "description": "The job is running: a cancel request was recorded; the "
                "handler is cancelled within one heartbeat, then the job is cancelled.",
            },
        },
        summary="Cancel a job",
        description="A queued, scheduled or blocked job becomes cancelled at once (200; "
        "repeating the request answers 200 again). A running job gets a cancel request "
        "(202, the job as it is: still running): its handler is cancelled within one "
        "heartbeat and the job becomes cancelled, unless it finishes first. A finished "
        "job, or one awaiting recovery: 409.",
    )
    async def cancel_job(job_id: uuid.UUID, caller: Who, response: Response) -> JobOut:
        done = await _operate(
            backend,
            f"cancel of job {job_id}",
            lambda conn: cancel_op(conn, caller, job_id, reason="cancelled by API"),
        )
        if done.changed:
            log.info(f"api.cancel_{done.action}", extra={"job_id": job_id, "org_id": caller.org_id})
        if done.action == "requested":
            response.status_code = 202
        return JobOut.from_job(done.job)

    @router.post(
        "/jobs/{job_id}/retry",
        summary="Retry a failed or cancelled job, as a new job",
        status_code=202,
        responses=responses(404, 409, 429, 503),
        description="A failed or cancelled job is retried as a new job of the same type, "
        "queue, payload and priority (202, the new job, with Location; its `retry_of` names "
        "the retried job, whose `retried_as` names it from then on). The retried job stays "
        "as it ended. The new job is admitted like a submission: over the token's "
        "submission rate, into a full queue (`queue_full`) or past the org's quota "
        "(`org_quota`): 429 with Retry-After, and nothing is written. A job is retried "
        "once: asking again answers the same new job. 409 when the job has not ended "
        "(`job_not_ended`), when its type is `at_most_once` and `force` is not set "
        "(`job_at_most_once`: its last run may have had effects), or when a job it "
        "depends on has not succeeded (`job_dependency`).",
    )
    async def retry_job(
        job_id: uuid.UUID,
        caller: Who,
        request: Request,
        response: Response,
        force: Annotated[bool, Query(description="Retry an at_most_once job too.")] = False,
    ) -> JobOut:
        _limit_submissions(backend, request, caller)
        # repeated once after a dropped connection like a read: a job is retried once,
        # so a second try answers the retry the first one made
        retried = await _operate(
            backend,
            f"retry of job {job_id}",
            lambda conn: retry_op(conn, caller, job_id, force=force),
        )
        if retried.created:
            log.info("api.retried", extra={"job_id": job_id, "org_id": caller.org_id})
        response.headers["Location"] = str(request.url_for("get_job", job_id=str(retried.job.id)))
        return JobOut.from_job(retried.job)

    @router.post(
        "/jobs/{job_id}/resolve",
        responses=responses(404, 409, 503),
        summary="Settle a job awaiting recovery",
        description="A `recovery_required` job (its outcome was unknown) is settled: "
        "`succeeded` (the work was done), `failed` (it was not) or `requeue` (run it "
        "again). 200, the job as written; recorded in its history. 409 "
        "`job_not_recovery_required` for a job in any other state.",
    )
    async def resolve_job(job_id: uuid.UUID, body: ResolveIn, caller: Who) -> JobOut:
        job = await _operate(
            backend,
            f"resolve of job {job_id}",
            lambda conn: resolve_op(conn, caller, job_id, body.outcome),
        )
        log.info("api.resolved", extra={"job_id": job_id, "org_id": caller.org_id})
        return JobOut.from_job(job)

    return router


async def _operate(
    backend: ApiBackend, operation: str, work: Callable[[AsyncConn], Awaitable[T]]
) -> T:
    """Run an operation of ``jobsd.ops`` (once more after a dropped connection): its
    refusals are answered through the one table (``problems.refused``), database
    errors with 503."""
    with _answering(operation):
        return await backend.read(operation, work)


@contextmanager
def _answering(operation: str) -> Iterator[None]:
    """Answer the refusals of ``jobsd.ops`` raised in the block through the one table
    (``problems.refused``), database errors with 503."""
    try:
        with store_errors(operation):
            yield
    except JobsdError as exc:
        if refusal(exc) is None:
            raise
        log.info("api.refused", extra={"operation": operation, "error": str(exc)})
        raise refused(exc) from None


def _org_of(caller: Caller) -> str:
    """Return the org a submission is for; 403 for an operator, who acts for none."""
    if caller.org_id is None:
        raise problem(
            403,
            "org_required",
            "an operator token acts for no org: use a token made by "
            "`jobsd token create --org ORG` to submit jobs",
        )
    return caller.org_id


def client_key(request: Request, caller: Caller) -> str:
    """Return the key the submission rate counts by: the request's token, else its
    org (every submission: ``POST /jobs``, a retry, a bulk retry)."""
    token_id = getattr(request.state, TOKEN_ID_STATE, None)
    if token_id is not None:
        return f"token:{token_id}"
    return f"org:{caller.org_id}" if caller.org_id is not None else "operator"


def _limit_submissions(backend: ApiBackend, request: Request, caller: Caller) -> None:
    """Take one submission from the token's bucket (429 when empty): a submitted job
    and a retry count alike."""
    key = client_key(request, caller)
    retry_s = backend.submission_wait(key)
    if retry_s is not None:
        assert backend.submit_limiter is not None
        log.info("api.rate_limited", extra={"key": key, "org_id": caller.org_id})
        raise rate_limited(backend.submit_limiter.rate.text, retry_s)


def _limit_reads(backend: ApiBackend, request: Request, caller: Caller) -> str:
    """Take one read from the token's bucket (429 when empty); return the token's key."""
    key = client_key(request, caller)
    limiter = backend.read_limiter
    if limiter is not None:
        wait_s = limiter.take(key)
        if wait_s > 0:
            log.info("api.read_rate_limited", extra={"key": key, "org_id": caller.org_id})
            retry_s = limiter.retry_after_s(wait_s)
            raise problem(
                429,
                "rate_limited",
                f"too many reads with this token (limit {limiter.rate.text}): retry in {retry_s} s",
                headers={"Retry-After": str(retry_s)},
            )
    return key


def _too_many_waits(backend: ApiBackend) -> Exception:
    caps = backend.longpolls
    log.info("api.longpoll_refused", extra={"open": caps.open})
    return problem(
        429,
        "too_many_waits",
        f"too many long-polls open (at most {caps.total} in all, {caps.per_key} per token): "
        "retry without ?wait= or later",
        headers={"Retry-After": "1"},
    )


async def _wait_terminal(
    backend: ApiBackend, job_id: uuid.UUID, caller: Caller, timeout_s: float
) -> None:
    """Return when the job is terminal, missing, or ``timeout_s`` has passed.

    The watch is registered before the first read: a notification that arrives
    between a read and the wait is not lost, it ends the next wait at once.
    """
    deadline = anyio.current_time() + timeout_s
    waiter = backend.waiter
    with waiter.watch(job_id) as watch:
        while True:
            async with backend.longpoll_reads:
                status = await backend.read(
                    f"status of job {job_id}", lambda conn: job_status(conn, caller, job_id)
                )
            if status is None or status.terminal:
                return
            remaining = deadline - anyio.current_time()
            if remaining <= 0 or waiter.closing:
                return
            await watch.wait(remaining)


def _check_fair(body: JobIn, http: HttpSettings) -> None:
    """Refuse (422) a priority outside the tokens' range, or a run_after too far ahead."""
    low, high = http.token_priority_min, http.token_priority_max
    if not low <= body.priority <= high:
        raise field_error(
            ("body", "priority"),
            f"priority must be between {low} and {high} for this API "
            "(JOBSD_TOKEN_PRIORITY_MIN, JOBSD_TOKEN_PRIORITY_MAX)",
            "priority_not_allowed",
            body.priority,
        )
    if body.run_after is not None:
        ahead_s = (body.run_after - datetime.now(UTC)).total_seconds()
        if ahead_s > http.max_schedule_ahead:
            raise field_error(
                ("body", "run_after"),
                f"run_after may be at most {http.max_schedule_ahead / 86400:g} days ahead "
                "(JOBSD_MAX_SCHEDULE_AHEAD)",
                "run_after_too_far",
                body.run_after.isoformat(),
            )
