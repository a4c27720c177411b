"""What every dashboard route stands on: the session, the page wrapper, templates, forms.

``Ui`` holds the templates (Jinja2, autoescaped), the session signer and the API's
backend. ``Ui.page`` wraps a route: no live session (a signed cookie naming a row of
``jobsd.ui_sessions`` that has not ended, not expired, and whose token is not
revoked) sends GETs to the login page; a POST must come from our own pages
(Origin), fit in a small form and carry the session's CSRF token; a database error
becomes an error page (503 while it is away). Logging out ends the session's row.
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
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from jobsd.errors import BackendUnavailable, DatabaseError, JobsdError
from jobsd.http.backend import ApiBackend, Lagged
from jobsd.http.problems import refusal
from jobsd.http.ui.session import COOKIE_NAME, Session, SessionSigner
from jobsd.http.ui.views import span
from jobsd.models import JobStatus
from jobsd.ops import Caller, tokens
from jobsd.ops.tokens import TokenGrant, end_session, find_session, start_session

__all__ = [
    "STATIC_DIR",
    "Handler",
    "Ui",
    "Viewer",
    "add_login_routes",
    "back_to_job",
    "headers",
    "job_id_of",
    "mount_static",
    "replica_notice",
]

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
STATIC_DIR = _HERE / "static"
_MAX_FORM_BYTES = 4096
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
    def caller(self) -> Caller:
        """Return the caller the viewer's token stands for (``Caller.of_grant``): an
        org's token acts for its org, whatever its admin flag."""
        return Caller.of_grant(self.grant, self.actor)

    @property
    def actor(self) -> str:
        """Return the name written in job histories for this viewer's actions."""
        who = self.grant.org_id if self.grant.org_id is not None else "operator"
        return f"ui:{who}:{str(self.grant.id)[:8]}"


def _ago(value: datetime | None) -> str:
    if value is None:
        return ""
    seconds = (datetime.now(UTC) - value).total_seconds()
    return span(seconds) + " ago" if seconds >= 0 else "in " + span(-seconds)


def _for(value: datetime | None) -> str:
    """Return how long it has been since ``value`` (a silence: ``12 s``)."""
    if value is None:
        return ""
    return span(max((datetime.now(UTC) - value).total_seconds(), 0.0))


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
    env.filters.update(ago=_ago, since=_for, span=span, when=_when, short_id=_short_id)
    return env


Handler = Callable[[Request, "Viewer"], Awaitable[Response]]


class Ui:
    """The dashboard's templates, session signer and backend, shared by its routes."""

    def __init__(self, backend: ApiBackend) -> None:
        self.backend = backend
        self.env = _environment()
        self.signer = SessionSigner(backend.http.ui_secret, backend.http.ui_session_ttl)

    def render(
        self,
        request: Request,
        template: str,
        viewer: Viewer | None,
        status: int = 200,
        *,
        served: Lagged[Any] | None = None,
        **ctx: Any,
    ) -> HTMLResponse:
        """Render a page; ``served``, the page's read, adds the replica notice."""
        html = self.env.get_template(template).render(
            viewer=viewer,
            path=request.url.path,
            states=list(JobStatus),
            replica_notice=replica_notice(served),
            **ctx,
        )
        return HTMLResponse(html, status_code=status, headers=headers())

    def error_page(
        self, request: Request, viewer: Viewer | None, status: int, message: str
    ) -> Response:
        return self.render(request, "error.html", viewer, status, title="Error", message=message)

    def refused(self, request: Request, viewer: Viewer, exc: JobsdError) -> Response:
        """Show an operation's refusal with the API's status for it (``refusal``, the
        one table); anything else is a bug: re-raise it."""
        found = refusal(exc)
        if found is None:
            raise exc
        return self.error_page(request, viewer, found[0], str(exc))

    async def viewer_of(self, request: Request) -> Viewer | None:
        """Return who holds the request's session, or None when it is not live."""
        session = self.signer.read(request.cookies.get(COOKIE_NAME))
        if session is None or session.session_id is None:
            return None
        live = await self.backend.read(
            "dashboard session lookup", find_session, session.session_id, session.token_hash
        )
        if live is None:
            return None
        return Viewer(live.grant, session, self.signer.csrf_token(session))

    def page(
        self,
        handler: Handler,
    ) -> Callable[[Request], Awaitable[Response]]:
        """Wrap a page: a session or the login page, and an error page for database errors."""

        async def run(request: Request) -> Response:
            viewer: Viewer | None = None
            try:
                viewer = await self.viewer_of(request)
                if viewer is None:
                    if request.method != "GET":
                        return self.error_page(request, None, 401, "log in first")
                    return RedirectResponse("/ui/login", status_code=303, headers=headers())
                if request.method == "POST":
                    if not same_origin(request):
                        return self.error_page(request, viewer, 403, "cross-site request refused")
                    form = await read_form(request)
                    if form is None:
                        return self.error_page(request, viewer, 413, "form too large")
                    if not self.signer.csrf_ok(viewer.session, form.get("csrf")):
                        log.warning("ui.csrf_refused", extra={"path": request.url.path})
                        return self.error_page(
                            request, viewer, 403, "the form has expired: reload the page"
                        )
                    request.state.form = form
                return await handler(request, viewer)
            except BackendUnavailable as exc:
                return self.error_page(request, viewer, 503, f"the database is unavailable: {exc}")
            except DatabaseError as exc:
                log.error("ui.database_error", exc_info=True)
                return self.error_page(request, viewer, 500, f"database error: {exc}")

        return run


def add_login_routes(router: APIRouter, ui: Ui) -> None:
    """Add the login form, the login and the logout."""

    @router.get("/login")
    async def login_form(request: Request) -> Response:
        return ui.render(request, "login.html", None, title="Log in", error=None)

    @router.post("/login")
    async def login(request: Request) -> Response:
        if not same_origin(request):  # no one else's page logs a browser in
            return ui.error_page(request, None, 403, "cross-site request refused")
        form = await read_form(request) or {}
        token = form.get("token", "").strip()
        token_hash = tokens.hash_token(token)
        opened = None
        if tokens.looks_like_token(token):
            try:
                opened = await ui.backend.read(
                    "dashboard login", start_session, token_hash, ui.signer.ttl_s
                )
            except BackendUnavailable as exc:
                return ui.error_page(request, None, 503, f"the database is unavailable: {exc}")
            except DatabaseError as exc:
                log.error("ui.database_error", exc_info=True)
                return ui.error_page(request, None, 500, f"database error: {exc}")
        if opened is None:
            log.info("ui.login_refused")
            return ui.render(
                request, "login.html", None, 401, title="Log in", error="unknown or revoked token"
            )
        grant = opened.grant
        log.info("ui.login", extra={"org_id": grant.org_id, "token_id": str(grant.id)})
        response = RedirectResponse("/ui", status_code=303, headers=headers())
        response.set_cookie(
            COOKIE_NAME,
            ui.signer.make(token_hash, session_id=opened.id),
            max_age=int(ui.signer.ttl_s),
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(request: Request, viewer: Viewer) -> Response:
        session = viewer.session
        if session.session_id is not None:  # always, for a viewer: it is a live session
            await ui.backend.read(
                "dashboard logout", end_session, session.session_id, session.token_hash
            )
        log.info("ui.logout", extra={"actor": viewer.actor})
        response = RedirectResponse("/ui/login", status_code=303, headers=headers())
        response.delete_cookie(COOKIE_NAME, path="/ui", httponly=True, samesite="strict")
        return response

    router.add_api_route("/logout", ui.page(logout), methods=["POST"])


def replica_notice(served: Lagged[Any] | None) -> str | None:
    """Return the notice of a page read from the read replica (None: from the primary)."""
    if served is None or not served.replica:
        return None
    if served.lag_s is None:
        return "read from a replica, delay unknown"
    return f"read from a replica, {span(served.lag_s)} behind"


def mount_static(app: Any) -> None:
    """Serve the dashboard's script and style sheet at /ui/static."""
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="ui-static")


def headers() -> dict[str, str]:
    """Return the security headers of every dashboard answer."""
    return {
        "Content-Security-Policy": _CSP,
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "same-origin",
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
    }


def same_origin(request: Request) -> bool:
    """Say whether a POST comes from our own pages: an Origin header, when the browser
    sends one, names this host (a second guard beside SameSite=Strict and CSRF)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:  # e.g. "http://[": no origin of ours
        return False
    return netloc == request.headers.get("host", "")


def job_id_of(request: Request) -> uuid.UUID | None:
    """Return the job id of the path, or None when it is not a UUID."""
    try:
        return uuid.UUID(request.path_params["job_id"])
    except ValueError:
        return None


def back_to_job(job_id: uuid.UUID, done: str) -> Response:
    """Redirect to the job's page with a message (303: the browser GETs it)."""
    return RedirectResponse(
        f"/ui/jobs/{job_id}?" + urlencode({"done": done}), status_code=303, headers=headers()
    )


async def read_form(request: Request) -> dict[str, str] | None:
    """Read a urlencoded form (first value of each field); None when it is too large."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_FORM_BYTES:
            return None
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}
