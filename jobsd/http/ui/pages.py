"""The dashboard's routes: login, overview, jobs, one job, and the operator's actions.

Pages are rendered on the server (Jinja2, autoescaped). Reads go through
``ApiBackend.read``; an org's session sees its org only, an admin's every org.
Actions are POST forms that carry the session's CSRF token; each one names its
actor (``ui:<org>:<token id>``) in the job's history.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from jobsd.admin.queues import check_queue_name, pause_queue, resume_queue
from jobsd.errors import (
    BackendUnavailable,
    DatabaseError,
    JobNotFound,
    RetryRefused,
    UnknownQueue,
)
from jobsd.http import tokens
from jobsd.http.backend import ApiBackend
from jobsd.http.health import build_report
from jobsd.http.routes import decode_cursor, encode_cursor
from jobsd.http.ui import views
from jobsd.http.ui.session import COOKIE_NAME, Session, SessionSigner
from jobsd.models import JobStatus
from jobsd.store import jobs_ops, queries
from jobsd.store import ui as store
from jobsd.store.db import AsyncConn
from jobsd.store.tokens import TokenGrant, find_token

__all__ = ["STATIC_DIR", "ui_router"]

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
STATIC_DIR = _HERE / "static"
PAGE_SIZE = 50
_MAX_FORM_BYTES = 4096
_RESOLVE = {"succeeded": "succeeded", "failed": "failed", "requeue": "queued"}
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is looking: the token's grant and the session (for the CSRF token)."""

    grant: TokenGrant
    session: Session
    csrf: str

    @property
    def scope(self) -> str | None:
        """Return the org whose jobs are visible, or None for an admin (every org)."""
        return None if self.grant.admin else self.grant.org_id

    @property
    def actor(self) -> str:
        """Return the name written in job histories for this viewer's actions."""
        return f"ui:{self.grant.org_id}:{str(self.grant.id)[:8]}"


def _ago(value: datetime | None) -> str:
    if value is None:
        return ""
    seconds = (datetime.now(UTC) - value).total_seconds()
    return _span(seconds) + " ago" if seconds >= 0 else "in " + _span(-seconds)


def _span(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def _short_id(value: object) -> str:
    """Return the end of a job id: UUIDv7 ids made close together share their start."""
    return "…" + str(value)[-12:]


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else ""


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(ago=_ago, span=_span, when=_when, short_id=_short_id)
    return env


def _parse_time(text: str | None) -> datetime | None:
    """Read a filter time (ISO 8601, e.g. from <input type=datetime-local>) as UTC."""
    if not text:
        return None
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def ui_router(backend: ApiBackend) -> APIRouter:
    """Build the /ui routes on ``backend`` (the API's pool and settings)."""
    router = APIRouter(prefix="/ui", include_in_schema=False)
    env = _environment()
    signer = SessionSigner(backend.http.ui_secret, backend.http.ui_session_ttl)

    def render(
        request: Request, template: str, viewer: Viewer | None, status: int = 200, **ctx: Any
    ) -> HTMLResponse:
        html = env.get_template(template).render(
            viewer=viewer, path=request.url.path, states=list(JobStatus), **ctx
        )
        return HTMLResponse(html, status_code=status, headers=_headers())

    def error_page(request: Request, viewer: Viewer | None, status: int, message: str) -> Response:
        return render(request, "error.html", viewer, status, title="Error", message=message)

    async def viewer_of(request: Request) -> Viewer | None:
        session = signer.read(request.cookies.get(COOKIE_NAME))
        if session is None:
            return None
        grant = await backend.read("token lookup", find_token, session.token_hash)
        if grant is None:
            return None
        return Viewer(grant, session, signer.csrf_token(session))

    def page(
        handler: Callable[[Request, Viewer], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        """Wrap a page: a session or the login page, and an error page for database errors."""

        async def run(request: Request) -> Response:
            viewer: Viewer | None = None
            try:
                viewer = await viewer_of(request)
                if viewer is None:
                    if request.method != "GET":
                        return error_page(request, None, 401, "log in first")
                    return RedirectResponse("/ui/login", status_code=303, headers=_headers())
                if request.method == "POST":
                    if not _same_origin(request):
                        return error_page(request, viewer, 403, "cross-site request refused")
                    form = await _form(request)
                    if form is None:
                        return error_page(request, viewer, 413, "form too large")
                    if not signer.csrf_ok(viewer.session, form.get("csrf")):
                        log.warning("ui.csrf_refused", extra={"path": request.url.path})
                        return error_page(
                            request, viewer, 403, "the form has expired: reload the page"
                        )
                    request.state.form = form
                return await handler(request, viewer)
            except BackendUnavailable as exc:
                return error_page(request, viewer, 503, f"the database is unavailable: {exc}")
            except DatabaseError as exc:
                log.error("ui.database_error", exc_info=True)
                return error_page(request, viewer, 500, f"database error: {exc}")

        return run

    # ---- login -------------------------------------------------------------------

    @router.get("/login")
    async def login_form(request: Request) -> Response:
        return render(request, "login.html", None, title="Log in", error=None)

    @router.post("/login")
    async def login(request: Request) -> Response:
        if not _same_origin(request):  # no one else's page logs a browser in
            return error_page(request, None, 403, "cross-site request refused")
        form = await _form(request) or {}
        token = form.get("token", "").strip()
        grant = None
        if tokens.looks_like_token(token):
            try:
                grant = await backend.read("token lookup", find_token, tokens.hash_token(token))
            except BackendUnavailable as exc:
                return error_page(request, None, 503, f"the database is unavailable: {exc}")
        if grant is None:
            log.info("ui.login_refused")
            return render(
                request, "login.html", None, 401, title="Log in", error="unknown or revoked token"
            )
        log.info("ui.login", extra={"org_id": grant.org_id, "token_id": str(grant.id)})
        response = RedirectResponse("/ui", status_code=303, headers=_headers())
        response.set_cookie(
            COOKIE_NAME,
            signer.make(tokens.hash_token(token)),
            max_age=int(signer.ttl_s),
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(request: Request, viewer: Viewer) -> Response:
        response = RedirectResponse("/ui/login", status_code=303, headers=_headers())
        response.delete_cookie(COOKIE_NAME, path="/ui", httponly=True, samesite="strict")
        return response

    router.add_api_route("/logout", page(logout), methods=["POST"])

    # ---- pages -------------------------------------------------------------------

    async def overview(request: Request, viewer: Viewer) -> Response:
        rows = await backend.read("overview", views.queue_rows, viewer.scope)
        workers = await backend.read("daemons", store.workers) if viewer.grant.admin else []
        failures = await backend.read("recent failures", store.recent_failures, viewer.scope)
        report = await build_report(backend)
        return render(
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

    router.add_api_route("", page(overview), methods=["GET"])

    async def jobs_list(request: Request, viewer: Viewer) -> Response:
        q = request.query_params
        try:
            status = JobStatus(q["status"]) if q.get("status") else None
            after = decode_cursor(q["cursor"]) if q.get("cursor") else None
            since, until = _parse_time(q.get("since")), _parse_time(q.get("until"))
        except ValueError as exc:
            return error_page(request, viewer, 400, f"bad filter: {exc}")
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
        found = await backend.read(
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
        return render(
            request,
            "jobs.html",
            viewer,
            title="Jobs",
            jobs=found.jobs,
            filters={k: q.get(k, "") for k in ("status", "type", "queue", "org", "since", "until")},
            next_url=next_url,
            progress_of=views.progress_of,
        )

    router.add_api_route("/jobs", page(jobs_list), methods=["GET"])

    async def job_page(request: Request, viewer: Viewer) -> Response:
        job_id = _job_id(request)
        view = (
            await backend.read("job page", views.job_view, job_id, viewer.scope) if job_id else None
        )
        if view is None:
            return error_page(
                request, viewer, 404, f"job {request.path_params['job_id']} not found"
            )
        return render(
            request,
            "job.html",
            viewer,
            title=f"Job {view.job['type']}",
            v=view,
            flash=request.query_params.get("done"),
        )

    router.add_api_route("/jobs/{job_id}", page(job_page), methods=["GET"])

    # ---- job actions ---------------------------------------------------------------

    async def cancel(request: Request, viewer: Viewer) -> Response:
        job_id = _job_id(request)
        if job_id is None:
            return error_page(request, viewer, 404, "no such job")
        done = await backend.read(
            f"cancel of job {job_id}",
            jobs_ops.cancel_job,
            job_id,
            actor=viewer.actor,
            reason="cancelled from the dashboard",
            org_id=viewer.scope,
        )
        if done.job is None:
            return error_page(request, viewer, 404, f"job {job_id} not found")
        if done.action == "none" and done.job.status not in (
            JobStatus.CANCELLED,
            JobStatus.RUNNING,
        ):
            return error_page(
                request, viewer, 409, f"job {job_id} is {done.job.status}: nothing to cancel"
            )
        if done.action == "requested":
            await backend.read(
                f"note on job {job_id}",
                store.note_event,
                job_id,
                actor=viewer.actor,
                reason="cancel requested from the dashboard",
                org_id=viewer.scope,
            )
        log.info("ui.cancel", extra={"job_id": str(job_id), "actor": viewer.actor})
        return _back_to_job(
            job_id, "cancel requested" if done.action == "requested" else "cancelled"
        )

    router.add_api_route("/jobs/{job_id}/cancel", page(cancel), methods=["POST"])

    async def resolve(request: Request, viewer: Viewer) -> Response:
        job_id = _job_id(request)
        if job_id is None:
            return error_page(request, viewer, 404, "no such job")
        outcome = _RESOLVE.get(request.state.form.get("outcome", ""))
        if outcome is None:
            return error_page(request, viewer, 400, "say how: succeeded, failed or requeue")

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

        found, status = await backend.read(f"resolve of job {job_id}", apply)
        if not found:
            return error_page(request, viewer, 404, f"job {job_id} not found")
        if status is None:
            return error_page(
                request, viewer, 409, f"job {job_id} is not recovery_required: nothing to resolve"
            )
        log.info("ui.resolve", extra={"job_id": str(job_id), "actor": viewer.actor})
        return _back_to_job(job_id, f"resolved: {status}")

    router.add_api_route("/jobs/{job_id}/resolve", page(resolve), methods=["POST"])

    async def retry(request: Request, viewer: Viewer) -> Response:
        job_id = _job_id(request)
        if job_id is None:
            return error_page(request, viewer, 404, "no such job")
        force = request.state.form.get("force") == "yes"
        try:
            job = await backend.read(
                f"retry of job {job_id}",
                jobs_ops.retry_job,
                job_id,
                actor=viewer.actor,
                force=force,
                org_id=viewer.scope,
            )
        except JobNotFound:
            return error_page(request, viewer, 404, f"job {job_id} not found")
        except RetryRefused as exc:
            return error_page(request, viewer, 409, str(exc))
        log.info("ui.retry", extra={"job_id": str(job_id), "actor": viewer.actor})
        return _back_to_job(job_id, f"retried: attempt {job.attempts + 1} is {job.status}")

    router.add_api_route("/jobs/{job_id}/retry", page(retry), methods=["POST"])

    # ---- queue actions (admin only) ------------------------------------------------

    def queue_action(
        verb: str, fn: Callable[[AsyncConn, str], Awaitable[Any]]
    ) -> Callable[[Request, Viewer], Awaitable[Response]]:
        async def act(request: Request, viewer: Viewer) -> Response:
            if not viewer.grant.admin:
                return error_page(request, viewer, 403, "only an admin token may act on queues")
            name = request.path_params["name"]
            try:
                check_queue_name(name)
                await backend.read(f"{verb} of queue {name!r}", fn, name)
            except (ValueError, UnknownQueue):
                return error_page(request, viewer, 404, f"queue {name!r} not found")
            log.info(f"ui.queue_{verb}", extra={"queue": name, "actor": viewer.actor})
            done = "paused" if verb == "pause" else "resumed"
            return RedirectResponse(
                "/ui?" + urlencode({"done": f"queue {name} {done}"}),
                status_code=303,
                headers=_headers(),
            )

        return act

    router.add_api_route(
        "/queues/{name}/pause", page(queue_action("pause", pause_queue)), methods=["POST"]
    )
    router.add_api_route(
        "/queues/{name}/resume", page(queue_action("resume", resume_queue)), methods=["POST"]
    )

    # ---- live data ----------------------------------------------------------------

    async def job_json(request: Request, viewer: Viewer) -> Response:
        job_id = _job_id(request)
        row = (
            await backend.read("job progress", store.get_job, job_id, viewer.scope)
            if job_id
            else None
        )
        if row is None:
            return JSONResponse({"detail": "not found"}, status_code=404, headers=_headers())
        progress = views.progress_of(row.get("progress"))
        return JSONResponse(
            {
                "status": row["status"],
                "done": progress[0] if progress else None,
                "total": progress[1] if progress else None,
            },
            headers=_headers(),
        )

    router.add_api_route("/jobs/{job_id}/live", page(job_json), methods=["GET"])
    return router


def mount_static(app: Any) -> None:
    """Serve the dashboard's script and style sheet at /ui/static."""
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="ui-static")


def _headers() -> dict[str, str]:
    return {
        "Content-Security-Policy": _CSP,
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "same-origin",
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
    }


def _same_origin(request: Request) -> bool:
    """Say whether a POST comes from our own pages: an Origin header, when the browser
    sends one, names this host (a second guard beside SameSite=Strict and CSRF)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.headers.get("host", "")


def _job_id(request: Request) -> uuid.UUID | None:
    try:
        return uuid.UUID(request.path_params["job_id"])
    except ValueError:
        return None


def _back_to_job(job_id: uuid.UUID, done: str) -> Response:
    return RedirectResponse(
        f"/ui/jobs/{job_id}?" + urlencode({"done": done}), status_code=303, headers=_headers()
    )


async def _form(request: Request) -> dict[str, str] | None:
    """Read a urlencoded form (first value of each field); None when it is too large."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_FORM_BYTES:
            return None
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}
