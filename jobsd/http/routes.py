"""The jobs endpoints: submit, read (and long-poll), list, cancel, retry; every one scoped
by org.

The org comes from a dependency: the bearer token in jobsd's own app, or whatever the
host application already knows when it mounts ``jobsd.http.router(org_dependency=...)``.
"""

# No `from __future__ import annotations` here: FastAPI reads the annotations of the
# endpoints at runtime, and `Org` is local to `jobs_router`.

import base64
import binascii
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, assert_never

import anyio
from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import AfterValidator

from jobsd.errors import (
    BackendUnavailable,
    DatabaseError,
    DuplicateJob,
    InvalidPayload,
    JobNotFound,
    OrgQuotaExceeded,
    PayloadTooLarge,
    QueueFull,
    RetryRefused,
    UnknownDependency,
    UnknownQueue,
)
from jobsd.http.auth import TOKEN_ID_STATE
from jobsd.http.backend import ApiBackend
from jobsd.http.problems import (
    QUEUE_FULL_RETRY_S,
    database_error,
    db_unavailable,
    endpoint_name,
    field_error,
    problem,
    rate_limited,
    responses,
    store_errors,
)
from jobsd.http.schemas import (
    QUEUE_PATTERN,
    JobDetail,
    JobIn,
    JobOut,
    JobPage,
    JobSummary,
    pg_text,
)
from jobsd.http.settings import HttpSettings
from jobsd.ids import uuid7
from jobsd.jobspec import JobSpec
from jobsd.models import JobStatus
from jobsd.store import api, jobs_ops, queries
from jobsd.store.db import acquire

__all__ = ["decode_cursor", "encode_cursor", "jobs_router"]

log = logging.getLogger(__name__)

MAX_PAGE = 200
# the actor recorded in job_events for changes made through the API
API_ACTOR = "api"


def encode_cursor(created_at: datetime, job_id: uuid.UUID) -> str:
    """Return the opaque cursor that resumes a listing after this job."""
    raw = f"{created_at.isoformat()}|{job_id}".encode("ascii")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> api.Cursor:
    """Read a cursor made by ``encode_cursor``; raise ValueError for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        when, _, job_id = raw.partition("|")
        created_at = datetime.fromisoformat(when)
        if created_at.tzinfo is None:
            raise ValueError("naive time")
        return api.Cursor(created_at, uuid.UUID(job_id))
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise ValueError("invalid cursor: pass next_cursor from the previous page") from exc


def jobs_router(
    backend: ApiBackend, org_dependency: Callable[..., Any], *, with_lifespan: bool
) -> APIRouter:
    """Build the jobs endpoints on ``backend``; ``org_dependency`` returns the caller's org id.

    With ``with_lifespan`` the router carries the backend's lifespan, which FastAPI
    merges into the lifespan of the app that includes it.
    """
    router = APIRouter(
        tags=["jobs"],
        lifespan=backend.lifespan if with_lifespan else None,
        generate_unique_id_function=endpoint_name,
    )
    Org = Annotated[str, Depends(org_dependency)]

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
    async def submit_job(body: JobIn, org_id: Org, request: Request, response: Response) -> JobOut:
        job_id = body.id or uuid7()
        _check_fair(body, backend.http)
        limiter = backend.submit_limiter
        if limiter is not None:
            token_id = getattr(request.state, TOKEN_ID_STATE, None)
            key = f"token:{token_id}" if token_id is not None else f"org:{org_id}"
            wait_s = limiter.take(key)
            if wait_s > 0:
                log.info("api.rate_limited", extra={"key": key, "org_id": org_id})
                raise rate_limited(limiter.rate.text, limiter.retry_after_s(wait_s))
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
        except OrgQuotaExceeded as exc:
            log.info("api.org_quota", extra={"queue": exc.queue, "org_id": org_id})
            raise problem(
                429, "org_quota", str(exc), headers={"Retry-After": str(QUEUE_FULL_RETRY_S)}
            ) from exc
        except QueueFull as exc:
            log.info("api.queue_full", extra={"queue": exc.queue, "org_id": org_id})
            raise problem(
                429, "queue_full", str(exc), headers={"Retry-After": str(QUEUE_FULL_RETRY_S)}
            ) from exc
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
        description="Keyset-paginated: pass `next_cursor` as `cursor` for the next page. "
        "Items leave out payload and report (read them with GET /jobs/{job_id}).",
    )
    async def list_jobs(
        org_id: Org,
        request: Request,
        status: Annotated[JobStatus | None, Query(description="Only this state.")] = None,
        type: Annotated[
            str | None,
            Query(max_length=200, description="Only this type."),
            AfterValidator(pg_text),
        ] = None,
        queue: Annotated[
            str | None, Query(pattern=QUEUE_PATTERN, description="Only this queue.")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Page size.")] = 50,
        cursor: Annotated[
            str | None, Query(max_length=200, description="`next_cursor` of the previous page.")
        ] = None,
    ) -> JobPage:
        _limit_reads(backend, request, org_id)
        after = None
        if cursor is not None:
            try:
                after = decode_cursor(cursor)
            except ValueError as exc:
                raise field_error(("query", "cursor"), str(exc), "invalid_cursor", cursor) from exc
        with store_errors("job listing"):
            rows = await backend.read(
                "job listing",
                api.list_job_rows,
                org_id,
                after=after,
                status=status,
                type=type,
                queue=queue,
                limit=limit + 1,
            )
        jobs = [JobSummary.from_row(r) for r in rows[:limit]]
        more = len(rows) > limit
        next_cursor = encode_cursor(jobs[-1].created_at, jobs[-1].id) if more else None
        return JobPage(jobs=jobs, next_cursor=next_cursor)

    @router.get(
        "/jobs/{job_id}",
        responses=responses(404, 429, 503),
        summary="Read a job and its history",
        description="With `wait=S`, answers as soon as the job is terminal (succeeded, failed, "
        "cancelled), woken by a database notification, or after S seconds (capped by "
        "JOBSD_LONGPOLL_MAX) with the current state. Over the token's read rate "
        "(JOBSD_READ_RATE), or with too many long-polls open (JOBSD_LONGPOLL_MAX_CONCURRENT "
        "in all, JOBSD_LONGPOLL_MAX_PER_TOKEN per token; code too_many_waits): 429 with "
        "Retry-After.",
    )
    async def get_job(
        job_id: uuid.UUID,
        org_id: Org,
        request: Request,
        wait: Annotated[
            float | None,
            Query(ge=0, allow_inf_nan=False, description="Long-poll for up to this many seconds."),
        ] = None,
    ) -> JobDetail:
        key = _limit_reads(backend, request, org_id)
        with store_errors(f"read of job {job_id}"):
            if wait:
                with backend.longpolls.hold(key) as admitted:
                    if not admitted:
                        raise _too_many_waits(backend)
                    timeout_s = min(wait, backend.http.longpoll_max)
                    await _wait_terminal(backend, job_id, org_id, timeout_s)
                    async with backend.longpoll_reads:
                        row = await backend.read(
                            f"read of job {job_id}", api.get_job_row, job_id, org_id
                        )
            else:
                row = await backend.read(f"read of job {job_id}", api.get_job_row, job_id, org_id)
        if row is None:
            raise _not_found(job_id)
        return JobDetail.from_row(row)

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
    async def cancel_job(job_id: uuid.UUID, org_id: Org, response: Response) -> JobOut:
        with store_errors(f"cancel of job {job_id}"):
            result = await backend.read(
                f"cancel of job {job_id}",
                queries.cancel_job,
                job_id,
                actor=API_ACTOR,
                reason="cancelled by API",
                org_id=org_id,
            )
        job = result.job
        if job is None:
            raise _not_found(job_id)
        if result.action == "cancelled":
            log.info("api.cancelled", extra={"job_id": job_id, "org_id": org_id})
        status = job.status
        match status:
            case JobStatus.CANCELLED:
                return JobOut.from_job(job)
            case JobStatus.RUNNING:
                if result.action == "requested":
                    log.info("api.cancel_requested", extra={"job_id": job_id, "org_id": org_id})
                response.status_code = 202
                return JobOut.from_job(job)
            case JobStatus.SUCCEEDED | JobStatus.FAILED:
                raise problem(409, "job_finished", f"the job has already {status}")
            case JobStatus.RECOVERY_REQUIRED:
                raise problem(
                    409,
                    "job_recovery_required",
                    "the job awaits an operator's decision (jobsd resolve), not a cancel",
                )
            case JobStatus.QUEUED | JobStatus.SCHEDULED | JobStatus.BLOCKED:
                # it changed state while we looked: the caller may simply retry
                raise problem(409, "job_changed", "the job changed state meanwhile: retry")
            case _:
                assert_never(status)

    @router.post(
        "/jobs/{job_id}/retry",
        responses=responses(404, 409, 503),
        summary="Retry a failed or cancelled job",
        description="A failed or cancelled job gets a new attempt of the same job: it is "
        "queued again (200, the job as it is now), recorded in its history (reason "
        "`retry`); attempts keep counting. 409 when the job has not ended "
        "(`job_not_ended`), when its type is `at_most_once` and `force` is not set "
        "(`job_at_most_once`: its last run may have had effects), or when a job it "
        "depends on has not succeeded (`job_dependency`).",
    )
    async def retry_job(
        job_id: uuid.UUID,
        org_id: Org,
        force: Annotated[bool, Query(description="Retry an at_most_once job too.")] = False,
    ) -> JobOut:
        operation = f"retry of job {job_id}"
        try:
            with store_errors(operation):
                # not backend.read: a retry is not repeated after a dropped connection
                async with acquire(backend.pool, operation) as conn:
                    job = await jobs_ops.retry_job(
                        conn, job_id, actor=API_ACTOR, force=force, org_id=org_id
                    )
        except JobNotFound:
            raise _not_found(job_id) from None
        except RetryRefused as exc:
            raise problem(409, f"job_{exc.why}", str(exc)) from None
        log.info("api.retried", extra={"job_id": job_id, "org_id": org_id, "force": force})
        return JobOut.from_job(job)

    return router


def _client_key(request: Request, org_id: str) -> str:
    """Return the key limits count by: the request's token, else its org."""
    token_id = getattr(request.state, TOKEN_ID_STATE, None)
    return f"token:{token_id}" if token_id is not None else f"org:{org_id}"


def _limit_reads(backend: ApiBackend, request: Request, org_id: str) -> str:
    """Take one read from the token's bucket (429 when empty); return the token's key."""
    key = _client_key(request, org_id)
    limiter = backend.read_limiter
    if limiter is not None:
        wait_s = limiter.take(key)
        if wait_s > 0:
            log.info("api.read_rate_limited", extra={"key": key, "org_id": org_id})
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


def _not_found(job_id: uuid.UUID) -> Exception:
    return problem(404, "job_not_found", f"job {job_id} not found")


async def _wait_terminal(
    backend: ApiBackend, job_id: uuid.UUID, org_id: str, timeout_s: float
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
                    f"status of job {job_id}", api.job_status, job_id, org_id
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
