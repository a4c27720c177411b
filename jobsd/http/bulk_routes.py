"""The bulk endpoints: ``POST /jobs/retry``, ``POST /jobs/cancel``, ``POST /jobs/resolve``.

Each acts on every job of a filter (the jobs list's, in a JSON body) in one call, as
``jobsd.ops.bulk`` does: within the caller's org (an operator token may name one),
oldest first, at most ``limit``, or only counts them (``dry_run``). The same tokens as
the single actions (``POST /jobs/{id}/retry`` ...) may call them. Their paths have one
segment after ``/jobs``, so they never match ``/jobs/{job_id}/...``; ``POST /jobs`` is
the submission.

A bulk retry submits new jobs: it counts against the token's submission rate as one
submission per job it may retry, as that many single retries would. It counts the
matching jobs first (a dry run), takes a submission for each (at least one, at most
``limit``) and retries at most as many as it took: when the token's bucket holds fewer,
the call retries fewer (``limit`` in the answer says how many it could), and an empty
bucket answers 429 with Retry-After. A cancel or a resolve submits nothing and is not
rate-limited, as their single forms.
"""

# No `from __future__ import annotations` here: FastAPI reads the annotations of the
# endpoints at runtime, and `Who` is local to `bulk_router`.

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, Self

from fastapi import APIRouter, Depends, Request
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from jobsd.http.backend import ApiBackend
from jobsd.http.problems import endpoint_name, field_error, rate_limited, responses, store_errors
from jobsd.http.routes import client_key
from jobsd.http.schemas import OrgFilter, QueueFilter, TypeFilter
from jobsd.ops import AsyncConn, Caller
from jobsd.ops.bulk import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    BulkOptions,
    BulkOutcome,
    cancel_many,
    resolve_many,
    retry_many,
)

__all__ = [
    "BulkCancelIn",
    "BulkOut",
    "BulkResolveIn",
    "BulkRetryIn",
    "bulk_router",
]

log = logging.getLogger(__name__)


class _BulkIn(BaseModel):
    """The filter and the size of a bulk call; every filter is optional."""

    model_config = ConfigDict(extra="forbid")

    type: TypeFilter | None = Field(default=None, description="Only jobs of this type.")
    queue: QueueFilter | None = Field(
        default=None, description="Only jobs of this queue (it must exist)."
    )
    org_id: OrgFilter | None = Field(
        default=None,
        description="Only this org's jobs: an operator token's choice. An org's token acts "
        "on its own org's jobs; naming another org matches nothing.",
    )
    since: AwareDatetime | None = Field(
        default=None, description="Only jobs created at or after this time."
    )
    until: AwareDatetime | None = Field(
        default=None, description="Only jobs created before this time (after `since`)."
    )
    limit: int = Field(
        default=DEFAULT_LIMIT,
        ge=1,
        le=MAX_LIMIT,
        description="At most this many jobs, oldest first; call again for the next ones.",
    )
    dry_run: bool = Field(
        default=False, description="Only count the jobs the call would take; change nothing."
    )

    @model_validator(mode="after")
    def _until_after_since(self) -> Self:
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise ValueError("until must be after since")
        return self

    def options(self, *, limit: int | None = None) -> BulkOptions:
        """Return the options of ``jobsd.ops.bulk`` (``limit``: another limit)."""
        return {
            "status": getattr(self, "status", None),
            "type": self.type,
            "queue": self.queue,
            "org_id": self.org_id,
            "since": self.since,
            "until": self.until,
            "limit": self.limit if limit is None else limit,
            "dry_run": self.dry_run,
        }


class BulkRetryIn(_BulkIn):
    """Which failed or cancelled jobs to retry, each as a new job."""

    status: Literal["failed", "cancelled"] = Field(
        default="failed", description="Retry the failed jobs, or the cancelled ones."
    )
    force: bool = Field(
        default=False,
        description="Retry jobs of at_most_once types too (their last run may have had effects).",
    )


class BulkCancelIn(_BulkIn):
    """Which open jobs to cancel."""

    status: Literal["queued", "scheduled", "blocked", "running"] | None = Field(
        default=None, description="Only jobs in this state; any open state when null."
    )


class BulkResolveIn(_BulkIn):
    """Which recovery_required jobs to settle, and how."""

    status: Literal["recovery_required"] | None = Field(
        default=None, description="The only state a resolve takes."
    )
    outcome: Literal["succeeded", "failed", "requeue", "queued"] = Field(
        description="succeeded: the work was done; failed: it was not; requeue (or queued, "
        "the state it leaves them in): run them again."
    )


class BulkOut(BaseModel):
    """What a bulk call did (or, for a dry run, would do)."""

    id: int | None = Field(
        description="The call's row of jobsd.bulk_actions, named in the history of each job "
        "it changed as `<actor> (bulk <id>)`; null for a dry run."
    )
    action: Literal["retry", "cancel", "resolve"]
    dry_run: bool
    limit: int = Field(
        description="The limit asked, or, for a retry the token's submission rate held "
        "back, the jobs it could retry: fewer than matched."
    )
    matched: int = Field(description="Jobs the call took (at most `limit`), oldest first.")
    done: int = Field(description="Jobs retried, cancelled (or asked to cancel) or resolved.")
    requested: int = Field(
        description="A cancel: the running jobs among `done`, whose cancel was requested."
    )
    refused: dict[str, int] = Field(
        description="Jobs taken but not done, by reason: queue_full, org_quota, at_most_once, "
        "dependency, changed, busy. A refused job still matches."
    )
    remaining: int = Field(description="Jobs still matching the filter after the call.")

    @classmethod
    def of(cls, outcome: BulkOutcome, limit: int) -> "BulkOut":
        """Build from an outcome of ``jobsd.ops.bulk``."""
        return cls.model_validate({**outcome.to_json(), "limit": limit})


def bulk_router(backend: ApiBackend, caller_dependency: Callable[..., Any]) -> APIRouter:
    """Build the bulk endpoints on ``backend``; ``caller_dependency`` returns the
    ``Caller``, as for the jobs endpoints."""
    router = APIRouter(tags=["jobs"], generate_unique_id_function=endpoint_name)
    Who = Annotated[Caller, Depends(caller_dependency)]

    async def act(
        name: str,
        body: _BulkIn,
        run: Callable[[AsyncConn, BulkOptions], Awaitable[BulkOutcome]],
        *,
        limit: int | None = None,
    ) -> BulkOutcome:
        operation = f"bulk {name} of jobs"
        options = body.options(limit=limit)
        try:
            with store_errors(operation):
                if body.dry_run:
                    return await backend.read(operation, lambda conn: run(conn, options))
                # a change: never repeated blindly after a dropped connection
                return await backend.once(operation, lambda conn: run(conn, options))
        except ValueError as exc:
            if body.queue is not None and "unknown queue" in str(exc):
                raise field_error(("body", "queue"), str(exc), "unknown_queue", body.queue) from exc
            raise field_error(("body",), str(exc), "invalid_filter") from exc

    def logged(name: str, caller: Caller, outcome: BulkOutcome) -> None:
        if not outcome.dry_run:
            log.info(
                f"api.bulk_{name}",
                extra={
                    "bulk_id": outcome.id,
                    "org_id": caller.org_id,
                    "done": outcome.done,
                    "refused": outcome.refused,
                },
            )

    @router.post(
        "/jobs/retry",
        responses=responses(429, 503),
        summary="Retry every failed (or cancelled) job of a filter, each as a new job",
        description="The failed jobs of the filter (or the cancelled ones: `status`) that "
        "have no retry yet, oldest first, at most `limit` (1..10000, default 1000), each "
        "retried as `POST /jobs/{job_id}/retry` would: a new job admitted like a "
        "submission. A job the queue's capacity or the org's quota refuses is counted in "
        "`refused` (`queue_full`, `org_quota`) and still matches; so is an at_most_once "
        "type without `force`, and a job whose dependency has not succeeded. Calling "
        "again continues with the jobs still matching (`remaining`). Counts against the "
        "token's submission rate as one submission per job it may retry: with fewer left "
        "in the token's bucket, it retries fewer (`limit` in the answer); with none, 429 "
        "with Retry-After and nothing is done. `dry_run` counts without retrying (and "
        "without counting against the rate).",
    )
    async def retry_jobs(body: BulkRetryIn, caller: Who, request: Request) -> BulkOut:
        def run(conn: AsyncConn, options: BulkOptions) -> Awaitable[BulkOutcome]:
            return retry_many(conn, caller, force=body.force, **options)

        limit, shown = body.limit, body.limit
        if not body.dry_run and backend.submit_limiter is not None:
            counted = await act("retry", body.model_copy(update={"dry_run": True}), run)
            key = client_key(request, caller)
            limit, wait_s = backend.take_submissions(key, max(1, min(limit, counted.matched)))
            if limit == 0:
                assert wait_s is not None
                log.info("api.rate_limited", extra={"key": key, "org_id": caller.org_id})
                raise rate_limited(backend.submit_limiter.rate.text, wait_s)
            if wait_s is not None:  # the bucket held fewer than the jobs to retry
                shown = limit
        outcome = await act("retry", body, run, limit=limit)
        logged("retry", caller, outcome)
        return BulkOut.of(outcome, shown)

    @router.post(
        "/jobs/cancel",
        responses=responses(503),
        summary="Cancel every open job of a filter",
        description="The open jobs of the filter (queued, scheduled, blocked, running; or "
        "one `status` of them), oldest first, at most `limit` (1..10000, default 1000), "
        "each cancelled as `POST /jobs/{job_id}/cancel` would: at once, or by a cancel "
        "request for a running job (`requested`), whose handler is stopped within one "
        "heartbeat. A running job whose cancel is requested already no longer matches. "
        "`dry_run` counts without cancelling.",
    )
    async def cancel_jobs(body: BulkCancelIn, caller: Who) -> BulkOut:
        def run(conn: AsyncConn, options: BulkOptions) -> Awaitable[BulkOutcome]:
            return cancel_many(conn, caller, reason="cancelled by API (bulk)", **options)

        outcome = await act("cancel", body, run)
        logged("cancel", caller, outcome)
        return BulkOut.of(outcome, body.limit)

    @router.post(
        "/jobs/resolve",
        responses=responses(503),
        summary="Settle every job of a filter awaiting recovery",
        description="The `recovery_required` jobs of the filter, oldest first, at most "
        "`limit` (1..10000, default 1000), each settled as `POST /jobs/{job_id}/resolve` "
        "would, as `outcome` says; recorded in each job's history. `dry_run` counts "
        "without settling.",
    )
    async def resolve_jobs(body: BulkResolveIn, caller: Who) -> BulkOut:
        def run(conn: AsyncConn, options: BulkOptions) -> Awaitable[BulkOutcome]:
            return resolve_many(conn, caller, body.outcome, **options)

        outcome = await act("resolve", body, run)
        logged("resolve", caller, outcome)
        return BulkOut.of(outcome, body.limit)

    return router
