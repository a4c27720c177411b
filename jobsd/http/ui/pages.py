"""The dashboard's pages: overview, jobs list, one job (and its live figures).

Pages are rendered on the server. Reads are the operations of ``jobsd.ops`` as the
viewer's caller, through ``ApiBackend.read``: an org's session sees its org only, an
operator's every org. A filter is checked as the API checks it
(``schemas.check_job_filters``): bad input is a 400 page, never a database error.
The routes are assembled here: login (``web``), pages, actions (``actions``),
schedules (``schedules_page``), job types (``types_page``).

With a read replica the pages are read there (``ApiBackend.read_lagging``; the page
says so, with its delay), except the page an action sends its viewer to (``?done=``):
that one shows the change just made, so it is read on the primary.
"""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from jobsd.errors import JobNotFound
from jobsd.http.backend import ApiBackend, Lagged
from jobsd.http.health import build_report
from jobsd.http.routes import decode_cursor, encode_cursor, lag_header
from jobsd.http.schemas import check_job_filters
from jobsd.http.ui import views
from jobsd.http.ui.actions import add_actions
from jobsd.http.ui.bulk import add_bulk, bulk_offer
from jobsd.http.ui.schedules_page import add_schedule_pages
from jobsd.http.ui.types_page import add_type_pages
from jobsd.http.ui.web import Ui, Viewer, add_login_routes, headers, job_id_of
from jobsd.models import JobView
from jobsd.ops import Act, may
from jobsd.ops.get import get_job
from jobsd.ops.overview import read_overview

__all__ = ["PAGE_SIZE", "ui_router"]

PAGE_SIZE = 50
# failed jobs the overview lists
FAILURES = 10


def _after_action(request: Request) -> bool:
    """Say whether the page is where an action sent its viewer (``?done=``): it must
    show the change, so it is not read on the replica."""
    return "done" in request.query_params


def ui_router(backend: ApiBackend) -> APIRouter:
    """Build the /ui routes on ``backend`` (the API's pool and settings)."""
    router = APIRouter(prefix="/ui", include_in_schema=False)
    ui = Ui(backend)
    add_login_routes(router, ui)

    async def overview(request: Request, viewer: Viewer) -> Response:
        caller = viewer.caller
        served = await ui.backend.read_lagging(
            "overview",
            lambda conn: read_overview(
                conn, caller, minutes=views.CHART_MINUTES, failures=FAILURES
            ),
            fresh=_after_action(request),
        )
        seen = served.value
        # the health warnings name every org's job types and counts: an operator's
        every_org = may(caller, Act.SEE_EVERY_ORG)
        warnings = (await build_report(ui.backend)).warnings if every_org else []
        return ui.render(
            request,
            "overview.html",
            viewer,
            title="Overview",
            served=served,
            queues=views.queue_rows(seen),
            # None: this API's role may not read the daemons (the page says so)
            workers=seen.workers if every_org else [],
            failures=seen.failures,
            warnings=warnings,
            chart=views,
            flash=request.query_params.get("done"),
        )

    router.add_api_route("", ui.page(overview), methods=["GET"])

    async def jobs_list(request: Request, viewer: Viewer) -> Response:
        q = request.query_params
        try:  # the API's own checks (schemas.check_job_filters), then the times
            checked = check_job_filters(
                status=q.get("status"),
                type=q.get("type"),
                queue=q.get("queue"),
                org_id=q.get("org"),
                cursor=q.get("cursor"),
            )
            after = decode_cursor(checked.cursor) if checked.cursor else None
            if after is not None:
                after = replace(after, created_at=views.utc(after.created_at))
            since, until = views.parse_time(q.get("since")), views.parse_time(q.get("until"))
        except ValueError as exc:
            return ui.error_page(request, viewer, 400, f"bad filter: {exc}")
        chosen = checked.model_dump(exclude={"cursor"})
        filters = views.JobFilter(**chosen, since=since, until=until)
        served = await ui.backend.read_lagging(
            "job listing",
            lambda conn: views.jobs_page(
                conn, viewer.caller, filters, after=after, limit=PAGE_SIZE
            ),
        )
        found = served.value
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
            served=served,
            jobs=found.jobs,
            filters={k: q.get(k, "") for k in ("status", "type", "queue", "org", "since", "until")},
            next_url=next_url,
            progress_of=views.progress_of,
            bulk=await bulk_offer(ui, viewer, filters, dict(q)),
        )

    router.add_api_route("/jobs", ui.page(jobs_list), methods=["GET"])

    async def read_job(request: Request, viewer: Viewer) -> Lagged[JobView] | None:
        """Read the job of the path as the viewer may see it (None: no such job); the
        replica may answer, the primary when it has no such job."""
        job_id = job_id_of(request)
        if job_id is None:
            return None
        try:
            return await ui.backend.read_lagging(
                f"read of job {job_id}",
                lambda conn: get_job(conn, viewer.caller, job_id),
                fresh=_after_action(request),
            )
        except JobNotFound:
            return None

    async def job_page(request: Request, viewer: Viewer) -> Response:
        served = await read_job(request, viewer)
        if served is None:
            return ui.error_page(
                request, viewer, 404, f"job {request.path_params['job_id']} not found"
            )
        read = served.value
        return ui.render(
            request,
            "job.html",
            viewer,
            title=f"Job {read.job.type}",
            served=served,
            v=views.job_page(read),
            flash=request.query_params.get("done"),
        )

    router.add_api_route("/jobs/{job_id}", ui.page(job_page), methods=["GET"])

    async def job_json(request: Request, viewer: Viewer) -> Response:
        served = await read_job(request, viewer)
        if served is None:
            return JSONResponse({"detail": "not found"}, status_code=404, headers=headers())
        read = served.value
        progress = views.progress_of(read.job.progress)
        return JSONResponse(
            {
                "status": str(read.job.status),
                "done": progress[0] if progress else None,
                "total": progress[1] if progress else None,
            },
            headers=headers() | lag_header(served),
        )

    router.add_api_route("/jobs/{job_id}/live", ui.page(job_json), methods=["GET"])
    add_actions(router, ui)
    add_bulk(router, ui)
    add_schedule_pages(router, ui)
    add_type_pages(router, ui)
    return router
