"""Hostile input on every dashboard route: a 4xx and an error page, never a 5xx.

Each route gets NUL characters, non-ASCII and invalid UTF-8, over-long text, bad job
ids, states, cursors, times and orgs, in its path, its query, its form fields, its
cookie and its Origin header, from an org's session and from an admin's. The jobs
list's filters are checked by the API's own validator: what the API refuses (422),
the dashboard refuses (400).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import psycopg
import pytest
from apikit import bearer, running_api, settings_for
from psycopg import sql
from support.jobs import job_row, make_job
from support.tokens import stored_token

from jobsd.http.routes import encode_cursor
from jobsd.http.ui.session import COOKIE_NAME

pytestmark = pytest.mark.anyio

# values as they travel in a URL or a form body: percent-encoded, sent as they are
HOSTILE = (
    "%00",
    "a%00b",
    "%00" * 300,
    "%C3%A9",  # é
    "%E6%97%A5%E6%9C%AC",  # two CJK characters
    "%F0%9F%92%A9",  # outside the BMP
    "%ED%A0%80",  # a surrogate's UTF-8 form: not valid UTF-8
    "%FF%FE",  # not UTF-8 at all
    "%E2%80%AE",  # right-to-left override
    "x" * 5000,
    "%20",
    "..%2F..%2Fetc%2Fpasswd",
    "%27%20OR%201%3D1%20--",
    "%3Cscript%3Ealert(1)%3C%2Fscript%3E",
    "-1",
    "99999999999999999999999999",
    "nan",
    "not-a-uuid",
    "00000000-0000-0000-0000-00000000000g",
    "%7B%7D",
)
FILTERS = ("status", "type", "queue", "org", "since", "until", "cursor")
BAD_TIMES = (
    "0000-01-01",
    "2024-13-01T00:00",
    "2024-01-01T25:00",
    "10000-01-01",
    "2024-01-01T00:00+25:00",
)


@dataclass
class Browser:
    """A logged-in client of the dashboard and the CSRF token of its session."""

    client: httpx.AsyncClient
    csrf: str
    admin: bool

    async def raw(
        self,
        method: str,
        target: str,
        body: str | None = None,
        headers: dict[str, str | bytes] | None = None,
    ) -> httpx.Response:
        """Send ``target`` (path and query, already encoded) and a form body as they are."""
        extra = {"content-type": "application/x-www-form-urlencoded"} if body is not None else {}
        return await self.client.request(
            method,
            target,
            content=body.encode("ascii") if body is not None else None,
            headers={**extra, **(headers or {})},
        )


@dataclass
class Scene:
    """The app, two logged-in browsers (an org's, an admin's), and one job of the org."""

    app: object
    org: Browser
    admin: Browser
    job: uuid.UUID
    failed: uuid.UUID
    stuck: uuid.UUID
    db_url: str

    @property
    def browsers(self) -> tuple[Browser, Browser]:
        return self.org, self.admin


async def _login(app: object, token: str, admin: bool) -> Browser:
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
        base_url="http://api.test",
    )
    answer = await client.post("/ui/login", data={"token": token})
    assert answer.status_code == 303, answer.text
    page = await client.get("/ui")
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text
    return Browser(client, found.group(1), admin)


@asynccontextmanager
async def scene(db_url: str) -> AsyncIterator[Scene]:
    org_token, admin_token = stored_token(db_url, "acme"), stored_token(db_url, None, admin=True)
    with psycopg.connect(db_url, autocommit=True) as conn:
        job = make_job(conn, org_id="acme", type="resize")
        claim = {"attempts": sql.SQL("attempts + 1"), "worker_id": "w1"}
        failed = make_job(conn, org_id="acme", status="failed", claim=claim)
        stuck = make_job(conn, org_id="acme", status="recovery_required", claim=claim)
    async with running_api(settings_for(db_url)) as api:
        org = await _login(api.app, org_token, admin=False)
        admin = await _login(api.app, admin_token, admin=True)
        try:
            yield Scene(api.app, org, admin, job, failed, stuck, db_url)
        finally:
            await org.client.aclose()
            await admin.client.aclose()


def _refused(answer: httpx.Response, what: str) -> None:
    """Assert a 4xx error page (or a redirect) and no server error."""
    assert answer.status_code < 500, f"{what}: {answer.status_code} {answer.text[:300]}"


def _assert_untouched(s: Scene) -> None:
    with psycopg.connect(s.db_url, autocommit=True) as conn:
        states = [job_row(conn, j)["status"] for j in (s.job, s.failed, s.stuck)]  # type: ignore[index]
        paused = conn.execute("SELECT count(*) FROM jobsd.queues WHERE paused_at IS NOT NULL")
        live = conn.execute("SELECT count(*) FROM jobsd.ui_sessions WHERE ended_at IS NULL")
        assert states == ["queued", "failed", "recovery_required"]
        assert paused.fetchone() == (0,)
        assert live.fetchone() == (2,)  # no hostile logout ended a session


def _gets(s: Scene, route: str) -> Iterable[str]:
    """The GET targets of ``route`` with each hostile value in each of its inputs."""
    for v in HOSTILE:
        match route:
            case "login_form":
                yield f"/ui/login?token={v}&next={v}"
            case "overview":
                yield f"/ui?done={v}"
            case "jobs":
                for name in FILTERS:
                    yield f"/ui/jobs?{name}={v}"
                yield f"/ui/jobs?type={v}&queue={v}&org={v}&status={v}&cursor={v}"
            case "job":
                yield f"/ui/jobs/{v}"
                yield f"/ui/jobs/{s.job}?done={v}"
            case "live":
                yield f"/ui/jobs/{v}/live"
                yield f"/ui/jobs/{s.job}/live?{v}={v}"
            case _:
                return


def _posts(s: Scene, route: str, csrf: str) -> Iterable[tuple[str, str]]:
    """The POST targets and form bodies of ``route`` with each hostile value.

    Where the CSRF token is valid, the action itself must refuse: a hostile job id or
    queue name, a hostile outcome, or a job in a state the action does not apply to.
    """
    for v in HOSTILE:
        match route:
            case "cancel" | "retry" | "resolve":
                # the job each refuses whatever the other fields say
                job = {"cancel": s.failed, "retry": s.job, "resolve": s.stuck}[route]
                yield f"/ui/jobs/{v}/{route}", f"csrf={csrf}&outcome=succeeded"
                yield f"/ui/jobs/{s.job}/{route}", f"csrf={v}"
                yield f"/ui/jobs/{s.job}/{route}", f"csrf={v}&csrf={csrf}"
                yield f"/ui/jobs/{job}/{route}", f"csrf={csrf}&outcome={v}&force={v}&{v}={v}"
                yield f"/ui/jobs/{s.job}/{route}", f"{v}={v}"
            case "pause" | "resume":
                yield f"/ui/queues/{v}/{route}", f"csrf={csrf}"
                yield "/ui/queues/default/pause", f"csrf={v}"
            case "logout":
                yield "/ui/logout", f"csrf={v}"
                yield "/ui/logout", f"{v}={v}"
            case "login":
                yield "/ui/login", f"token={v}"
                yield "/ui/login", f"token=jobsd_{v}"
            case _:
                return


ROUTES = (
    "login_form",
    "login",
    "overview",
    "jobs",
    "job",
    "live",
    "cancel",
    "retry",
    "resolve",
    "pause",
    "resume",
    "logout",
)


@pytest.mark.parametrize("route", ROUTES)
async def test_no_hostile_input_makes_a_server_error(db_url: str, route: str) -> None:
    async with scene(db_url) as s:
        for browser in s.browsers:
            who = "admin" if browser.admin else "org"
            for target in _gets(s, route):
                _refused(await browser.raw("GET", target), f"{who} GET {target[:80]}")
            for target, body in _posts(s, route, browser.csrf):
                answer = await browser.raw("POST", target, body)
                what = f"{who} POST {target[:80]} {body[:80]}"
                _refused(answer, what)
                assert 400 <= answer.status_code < 500, what  # never an action done (303)
        _assert_untouched(s)


async def test_hostile_cookies_and_origins_are_refused(db_url: str) -> None:
    async with scene(db_url) as s:
        browser = s.org
        for cookie in (b"\x00", "é".encode(), b"x" * 5000, b"a.b", b"..", b"%00.%00", b"\xff"):
            answer = await browser.raw(
                "GET", "/ui", headers={"cookie": COOKIE_NAME.encode() + b"=" + cookie}
            )
            assert answer.status_code == 303, cookie  # to the login page
        for origin in ("http://[", "http://[::1", "\x00", "null", "http://api.test:99999", "é"):
            headers: dict[str, str | bytes] = {"origin": origin.encode()}
            answer = await browser.raw(
                "POST", f"/ui/jobs/{s.job}/cancel", f"csrf={browser.csrf}", headers
            )
            assert answer.status_code == 403, origin
            login = await browser.raw("POST", "/ui/login", "token=x", headers)
            assert login.status_code == 403, origin
        _assert_untouched(s)


async def test_bad_filters_of_the_job_list_are_a_400_page(db_url: str) -> None:
    async with scene(db_url) as s:
        for browser in s.browsers:
            for target in (
                "/ui/jobs?type=a%00b",
                "/ui/jobs?queue=a%00b",
                "/ui/jobs?org=a%00b",
                "/ui/jobs?type=" + "t" * 201,
                "/ui/jobs?queue=%C3%A9",
                "/ui/jobs?org=" + "o" * 256,
                "/ui/jobs?status=done",
                "/ui/jobs?cursor=nope",
                "/ui/jobs?cursor=" + "A" * 201,
                *(f"/ui/jobs?since={t}" for t in BAD_TIMES),
                *(f"/ui/jobs?until={t}" for t in BAD_TIMES),
            ):
                answer = await browser.raw("GET", target)
                assert answer.status_code == 400, (target[:60], answer.status_code)
                assert "bad filter" in answer.text and 'role="alert"' in answer.text
            # and what is well-formed still lists
            good = encode_cursor(job_row_created(s), uuid.UUID(int=0))
            for target in (
                "/ui/jobs?type=resize&queue=default&status=queued",
                "/ui/jobs?type=&queue=&org=&status=&cursor=",
                "/ui/jobs?type=%C3%A9t%C3%A9",
                f"/ui/jobs?cursor={good}",
                "/ui/jobs?since=2024-01-01T00:00&until=2999-01-01T00:00:00",
                "/ui/jobs?org=acme",
            ):
                answer = await browser.raw("GET", target)
                assert answer.status_code == 200, (target, answer.text[:300])


def job_row_created(s: Scene) -> object:
    with psycopg.connect(s.db_url, autocommit=True) as conn:
        return job_row(conn, s.job)["created_at"]  # type: ignore[index]


async def test_a_non_ascii_csrf_token_is_a_403_page(db_url: str) -> None:
    async with scene(db_url) as s:
        for browser in s.browsers:
            for body in ("csrf=%C3%A9", "csrf=%E6%97%A5" * 20, "csrf=%00", "csrf=%FF"):
                answer = await browser.raw("POST", f"/ui/jobs/{s.job}/cancel", body)
                assert answer.status_code == 403, (body, answer.status_code)
                assert "the form has expired" in answer.text
        _assert_untouched(s)


@pytest.mark.parametrize(
    "name, value",
    [
        ("type", "a%00b"),
        ("type", "%00"),
        ("type", "t" * 201),
        ("type", "t" * 200),
        ("type", "%C3%A9"),
        ("type", "%ED%A0%80"),
        ("queue", "a%00b"),
        ("queue", "%C3%A9"),
        ("queue", "q" * 64),
        ("queue", "q" * 63),
        ("queue", "mail.eu-1:x"),
        ("queue", "-mail"),
        ("status", "done"),
        ("status", "failed"),
        ("status", "%00"),
        ("cursor", "nope"),
        ("cursor", "A" * 201),
        ("cursor", "%00"),
    ],
)
async def test_the_dashboard_refuses_what_the_api_refuses(
    db_url: str, name: str, value: str
) -> None:
    async with scene(db_url) as s:
        api_token = stored_token(db_url, "acme")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=s.app),  # type: ignore[arg-type]
            base_url="http://api.test",
        ) as client:
            api = await client.get(f"/jobs?{name}={value}", headers=bearer(api_token))
        assert api.status_code in (200, 422), api.text
        ui = await s.org.raw("GET", f"/ui/jobs?{name}={value}")
        assert ui.status_code in (200, 400), ui.text[:300]
        assert (api.status_code == 422) == (ui.status_code == 400), (api.text, ui.status_code)
