"""The dashboard's pages: overview, jobs list, one job (and its live figures).

Pages are rendered on the server. Reads go through ``ApiBackend.read``; an org's
session sees its org only, an admin's every org. The routes are assembled here:
login (``web``), pages, actions (``actions``).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from jobsd.http.backend import ApiBackend
from jobsd.http.health import build_report
from jobsd.http.routes import decode_cursor, encode_cursor
from jobsd.http.ui import views
from jobsd.http.ui.actions import add_actions
from jobsd.http.ui.web import Ui, Viewer, add_login_routes, headers, job_id_of
from jobsd.models import JobStatus
from jobsd.store import ui as store
from jobsd.store.db import AsyncConn

__all__ = ["PAGE_SIZE", "ui_router"]

PAGE_SIZE = 50

T = TypeVar("T")


def _parse_time(text: str | None) -> datetime | None:
    """Read a filter time (ISO 8601, e.g. from <input type=datetime-local>) as UTC."""
    if not text:
        return None
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def ui_router(backend: ApiBackend) -> APIRouter:
    """Build the /ui routes on ``backend`` (the API's pool and settings)."""
    router = APIRouter(prefix="/ui", include_in_schema=False)
    ui = Ui(backend)
    add_login_routes(router, ui)

    async def overview(request: Request, viewer: Viewer) -> Response:
        rows = await ui.backend.read("overview", views.queue_rows, viewer.scope)
        workers = await ui.backend.read("daemons", store.workers) if viewer.grant.admin else []
        failures = await ui.backend.read("recent failures", store.recent_failures, viewer.scope)
        report = await build_report(ui.backend)
        return ui.render(
            request,
            "overview.html",
            viewer,
            title="Overview",
            queues=rows,
            workers=workers,
            failures=failures,
            warnings=report.warnings,
            chart=views,
            flash=request.query_params.get("done"),
        )

    router.add_api_route("", ui.page(overview), methods=["GET"])

    async def jobs_list(request: Request, viewer: Viewer) -> Response:
        q = request.query_params
        try:
            status = JobStatus(q["status"]) if q.get("status") else None
            after = decode_cursor(q["cursor"]) if q.get("cursor") else None
            since, until = _parse_time(q.get("since")), _parse_time(q.get("until"))
        except ValueError as exc:
            return ui.error_page(request, viewer, 400, f"bad filter: {exc}")
        queue = q.get("queue") or None
        org = q.get("org") or None
        filters = views.JobFilter(
            org_id=org,
            status=status,
            type=q.get("type") or None,
            queue=queue,
            since=since,
            until=until,
        )
        found = await ui.backend.read(
            "job listing",
            views.jobs_page,
            filters,
            after=after,
            limit=PAGE_SIZE,
            scope=viewer.scope,
        )
        next_url = None
        if found.next is not None:
            kept = {k: v for k, v in q.items() if v and k != "cursor"}
            kept["cursor"] = encode_cursor(found.next.created_at, found.next.id)
            next_url = "/ui/jobs?" + urlencode(kept)
        return ui.render(
            request,
            "jobs.html",
            viewer,
            title="Jobs",
            jobs=found.jobs,
            filters={k: q.get(k, "") for k in ("status", "type", "queue", "org", "since", "until")},
            next_url=next_url,
            progress_of=views.progress_of,
        )

    router.add_api_route("/jobs", ui.page(jobs_list), methods=["GET"])

    async def read_job(
        request: Request,
        viewer: Viewer,
        operation: str,
        read: Callable[[AsyncConn, uuid.UUID, str | None], Awaitable[T | None]],
    ) -> T | None:
        """Read the job of the path as the viewer may see it (None: no such job)."""
        job_id = job_id_of(request)
        return await ui.backend.read(operation, read, job_id, viewer.scope) if job_id else None

    async def job_page(request: Request, viewer: Viewer) -> Response:
        view = await read_job(request, viewer, "job page", views.job_view)
        if view is None:
            return ui.error_page(
                request, viewer, 404, f"job {request.path_params['job_id']} not found"
            )
        return ui.render(
            request,
            "job.html",
            viewer,
            title=f"Job {view.job['type']}",
            v=view,
            flash=request.query_params.get("done"),
        )

    router.add_api_route("/jobs/{job_id}", ui.page(job_page), methods=["GET"])

    async def job_json(request: Request, viewer: Viewer) -> Response:
        row = await read_job(request, viewer, "job progress", store.get_job)
        if row is None:
            return JSONResponse({"detail": "not found"}, status_code=404, headers=headers())
        progress = views.progress_of(row.get("progress"))
        return JSONResponse(
            {
                "status": row["status"],
                "done": progress[0] if progress else None,
                "total": progress[1] if progress else None,
            },
            headers=headers(),
        )

    router.add_api_route("/jobs/{job_id}/live", ui.page(job_json), methods=["GET"])
    add_actions(router, ui)
    return router
