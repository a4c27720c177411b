"""The dashboard's actions: cancel, retry and resolve a job; pause and resume a queue.

Each is a POST that ``Ui.page`` has checked (session, origin, CSRF). Each calls the
operation of ``jobsd.ops`` as the viewer's caller (an org's token acts on its own jobs
only, whatever its admin flag; queues are an operator's), the history naming the
viewer; a refusal is shown with the status the API answers it with (``refusal``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from jobsd.errors import JobsdError
from jobsd.http.ui.web import Ui, Viewer, back_to_job, headers, job_id_of
from jobsd.ops import AsyncConn, Caller
from jobsd.ops.cancel import cancel_job
from jobsd.ops.queues import pause_queue, resume_queue
from jobsd.ops.resolve import Resolution, resolve_job
from jobsd.ops.retry import retry_job

__all__ = ["add_actions"]

log = logging.getLogger(__name__)


def add_actions(router: APIRouter, ui: Ui) -> None:
    """Add the job and queue actions to the /ui router."""

    refused = ui.refused

    async def cancel(request: Request, viewer: Viewer) -> Response:
        job_id = job_id_of(request)
        if job_id is None:
            return ui.error_page(request, viewer, 404, "no such job")
        caller = viewer.caller
        try:
            done = await ui.backend.read(
                f"cancel of job {job_id}",
                lambda conn: cancel_job(
                    conn, caller, job_id, reason="cancelled from the dashboard"
                ),
            )
        except JobsdError as exc:
            return refused(request, viewer, exc)
        log.info("ui.cancel", extra={"job_id": str(job_id), "actor": viewer.actor})
        return back_to_job(
            job_id, "cancel requested" if done.action == "requested" else "cancelled"
        )

    router.add_api_route("/jobs/{job_id}/cancel", ui.page(cancel), methods=["POST"])

    async def resolve(request: Request, viewer: Viewer) -> Response:
        job_id = job_id_of(request)
        if job_id is None:
            return ui.error_page(request, viewer, 404, "no such job")
        how = request.state.form.get("outcome", "")
        if how not in set(Resolution):
            return ui.error_page(request, viewer, 400, "say how: succeeded, failed or requeue")
        caller = viewer.caller
        try:
            job = await ui.backend.read(
                f"resolve of job {job_id}", lambda conn: resolve_job(conn, caller, job_id, how)
            )
        except JobsdError as exc:
            return refused(request, viewer, exc)
        log.info("ui.resolve", extra={"job_id": str(job_id), "actor": viewer.actor})
        return back_to_job(job_id, f"resolved: {job.status}")

    router.add_api_route("/jobs/{job_id}/resolve", ui.page(resolve), methods=["POST"])

    async def retry(request: Request, viewer: Viewer) -> Response:
        job_id = job_id_of(request)
        if job_id is None:
            return ui.error_page(request, viewer, 404, "no such job")
        force = request.state.form.get("force") == "yes"
        caller = viewer.caller
        wait_s = ui.backend.submission_wait(f"token:{viewer.grant.id}")
        if wait_s is not None:
            return ui.error_page(
                request, viewer, 429, f"too many submissions with this token: retry in {wait_s} s"
            )
        try:
            retried = await ui.backend.read(
                f"retry of job {job_id}", lambda conn: retry_job(conn, caller, job_id, force=force)
            )
        except JobsdError as exc:
            return refused(request, viewer, exc)
        log.info("ui.retry", extra={"job_id": str(job_id), "actor": viewer.actor})
        return back_to_job(retried.job.id, f"retry of job {job_id}: {retried.job.status}")

    router.add_api_route("/jobs/{job_id}/retry", ui.page(retry), methods=["POST"])

    def queue_action(
        verb: str, fn: Callable[[AsyncConn, Caller, str], Awaitable[Any]]
    ) -> Callable[[Request, Viewer], Awaitable[Response]]:
        async def act(request: Request, viewer: Viewer) -> Response:
            name = request.path_params["name"]
            caller = viewer.caller
            try:
                await ui.backend.read(f"{verb} of queue {name!r}", lambda c: fn(c, caller, name))
            except JobsdError as exc:
                return refused(request, viewer, exc)
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
