"""The dashboard's actions: cancel, retry and resolve a job; pause and resume a queue.

Each is a POST that ``Ui.page`` has checked (session, origin, CSRF). The job actions
call the operations every front end shares (``store.jobs_ops``: cancel, retry;
``store.queries.resolve_job``) with the viewer's org as scope, so an org's token acts
on its own jobs only, and record the viewer as the actor in the job's history. Queue
actions are for admin tokens (403 otherwise).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from jobsd.admin.queues import check_queue_name, pause_queue, resume_queue
from jobsd.errors import JobNotFound, RetryRefused, UnknownQueue
from jobsd.http.ui.web import Ui, Viewer, back_to_job, headers, job_id_of
from jobsd.models import JobStatus
from jobsd.store import jobs_ops, queries
from jobsd.store import ui as store
from jobsd.store.db import AsyncConn
from jobsd.store.jobs_ops import CancelOutcome

__all__ = ["add_actions"]

log = logging.getLogger(__name__)

_RESOLVE = {"succeeded": "succeeded", "failed": "failed", "requeue": "queued"}


def add_actions(router: APIRouter, ui: Ui) -> None:
    """Add the job and queue actions to the /ui router."""

    async def cancel(request: Request, viewer: Viewer) -> Response:
        job_id = job_id_of(request)
        if job_id is None:
            return ui.error_page(request, viewer, 404, "no such job")

        async def apply(conn: AsyncConn) -> CancelOutcome:
            done = await jobs_ops.cancel_job(
                conn,
                job_id,
                actor=viewer.actor,
                reason="cancelled from the dashboard",
                org_id=viewer.scope,
            )
            if done.action == "requested":
                # the job runs on until its handler stops: the history says who asked
                await store.note_event(
                    conn,
                    job_id,
                    actor=viewer.actor,
                    reason="cancel requested from the dashboard",
                    org_id=viewer.scope,
                )
            return done

        done = await ui.backend.read(f"cancel of job {job_id}", apply)
        if done.job is None:
            return ui.error_page(request, viewer, 404, f"job {job_id} not found")
        if done.action == "none" and done.job.status not in (
            JobStatus.CANCELLED,
            JobStatus.RUNNING,
        ):
            return ui.error_page(
                request, viewer, 409, f"job {job_id} is {done.job.status}: nothing to cancel"
            )
        log.info("ui.cancel", extra={"job_id": str(job_id), "actor": viewer.actor})
        return back_to_job(
            job_id, "cancel requested" if done.action == "requested" else "cancelled"
        )

    router.add_api_route("/jobs/{job_id}/cancel", ui.page(cancel), methods=["POST"])

    async def resolve(request: Request, viewer: Viewer) -> Response:
        job_id = job_id_of(request)
        if job_id is None:
            return ui.error_page(request, viewer, 404, "no such job")
        outcome = _RESOLVE.get(request.state.form.get("outcome", ""))
        if outcome is None:
            return ui.error_page(request, viewer, 400, "say how: succeeded, failed or requeue")

        async def apply(conn: AsyncConn) -> tuple[bool, str | None]:
            row = await store.get_job(conn, job_id, viewer.scope)
            if row is None:
                return False, None
            written = await queries.resolve_job(
                conn,
                job_id,
                status=outcome,
                reason="resolved from the dashboard",
                actor=viewer.actor,
                error="resolved as failed by an operator" if outcome == "failed" else None,
            )
            return True, str(written.status) if written else None

        found, status = await ui.backend.read(f"resolve of job {job_id}", apply)
        if not found:
            return ui.error_page(request, viewer, 404, f"job {job_id} not found")
        if status is None:
            return ui.error_page(
                request, viewer, 409, f"job {job_id} is not recovery_required: nothing to resolve"
            )
        log.info("ui.resolve", extra={"job_id": str(job_id), "actor": viewer.actor})
        return back_to_job(job_id, f"resolved: {status}")

    router.add_api_route("/jobs/{job_id}/resolve", ui.page(resolve), methods=["POST"])

    async def retry(request: Request, viewer: Viewer) -> Response:
        job_id = job_id_of(request)
        if job_id is None:
            return ui.error_page(request, viewer, 404, "no such job")
        force = request.state.form.get("force") == "yes"
        try:
            job = await ui.backend.read(
                f"retry of job {job_id}",
                jobs_ops.retry_job,
                job_id,
                actor=viewer.actor,
                force=force,
                org_id=viewer.scope,
            )
        except JobNotFound:
            return ui.error_page(request, viewer, 404, f"job {job_id} not found")
        except RetryRefused as exc:
            return ui.error_page(request, viewer, 409, str(exc))
        log.info("ui.retry", extra={"job_id": str(job_id), "actor": viewer.actor})
        return back_to_job(job_id, f"retried: attempt {job.attempts + 1} is {job.status}")

    router.add_api_route("/jobs/{job_id}/retry", ui.page(retry), methods=["POST"])

    def queue_action(
        verb: str, fn: Callable[[AsyncConn, str], Awaitable[Any]]
    ) -> Callable[[Request, Viewer], Awaitable[Response]]:
        async def act(request: Request, viewer: Viewer) -> Response:
            if not viewer.grant.admin:
                return ui.error_page(request, viewer, 403, "only an admin token may act on queues")
            name = request.path_params["name"]
            try:
                check_queue_name(name)
                await ui.backend.read(f"{verb} of queue {name!r}", fn, name)
            except (ValueError, UnknownQueue):
                return ui.error_page(request, viewer, 404, f"queue {name!r} not found")
            log.info(f"ui.queue_{verb}", extra={"queue": name, "actor": viewer.actor})
            done = "paused" if verb == "pause" else "resumed"
            return RedirectResponse(
                "/ui?" + urlencode({"done": f"queue {name} {done}"}),
                status_code=303,
                headers=headers(),
            )

        return act

    router.add_api_route(
        "/queues/{name}/pause", ui.page(queue_action("pause", pause_queue)), methods=["POST"]
    )
    router.add_api_route(
        "/queues/{name}/resume", ui.page(queue_action("resume", resume_queue)), methods=["POST"]
    )
