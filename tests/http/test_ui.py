"""The dashboard (/ui) in-process against a real Postgres: login and sessions, CSRF, what
an org and an admin see, the lists and the job page, and every action's outcome."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from apikit import http_settings, running_api, settings_for
from psycopg import sql
from support.history import assert_history_complete
from support.jobs import job_row, make_job, make_jobs

from jobsd.http.ui.session import COOKIE_NAME, SessionSigner
from jobsd.ops import Caller
from jobsd.ops.tokens import create_token, revoke_token

OPERATOR = Caller.as_operator("tests")

pytestmark = pytest.mark.anyio

CLAIM = {"attempts": sql.SQL("attempts + 1"), "worker_id": "w1"}


def admin_token(db_url: str, org_id: str = "ops") -> str:
    with psycopg.connect(db_url, autocommit=True) as conn:
        token, _ = create_token(conn, OPERATOR, None, "ui", admin=True)
    return token


async def login(client: httpx.AsyncClient, token: str) -> str:
    """Log in; return the CSRF token of the first page."""
    response = await client.post("/ui/login", data={"token": token})
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/ui"
    page = await client.get("/ui")
    assert page.status_code == 200, page.text
    return csrf_of(page.text)


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


def events(db_url: str, job_id: object) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT from_status, to_status, worker_id, reason FROM jobsd.all_job_events "
            "WHERE job_id = %s ORDER BY id",
            (job_id,),
        )
        cols = [c.name for c in cur.description or []]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


async def test_pages_need_a_login_and_the_session_cookie_is_strict(
    db_url: str, token_a: str
) -> None:
    async with running_api(settings_for(db_url)) as api:
        first = await api.client.get("/ui")
        assert first.status_code == 303
        assert first.headers["location"] == "/ui/login"
        for path in ("/ui/jobs", f"/ui/jobs/{uuid.uuid4()}"):
            assert (await api.client.get(path)).status_code == 303
        form = await api.client.get("/ui/login")
        assert form.status_code == 200 and 'name="token"' in form.text
        assert "default-src 'none'" in form.headers["content-security-policy"]

        refused = await api.client.post("/ui/login", data={"token": "jobsd_" + "x" * 43})
        assert refused.status_code == 401 and "unknown or revoked token" in refused.text
        assert COOKIE_NAME not in refused.cookies

        ok = await api.client.post("/ui/login", data={"token": token_a})
        assert ok.status_code == 303 and ok.headers["location"] == "/ui"
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
        assert "Secure" not in cookie  # plain http here; https below
        assert token_a not in cookie  # the cookie holds a signed hash, never the token
        page = await api.client.get("/ui")
        assert page.status_code == 200 and "acme" in page.text
        assert token_a not in page.text

        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=api.app), base_url="https://api.test"
        ) as tls:
            secure = await tls.post("/ui/login", data={"token": token_a})
            assert "Secure" in secure.headers["set-cookie"]


async def test_a_revoked_token_ends_its_sessions_and_a_forged_cookie_is_refused(
    db_url: str, token_a: str
) -> None:
    async with running_api(settings_for(db_url)) as api:
        await login(api.client, token_a)
        with psycopg.connect(db_url, autocommit=True) as conn:
            assert revoke_token(conn, OPERATOR, token_a) is not None
        gone = await api.client.get("/ui")
        assert gone.status_code == 303 and gone.headers["location"] == "/ui/login"

        other_key = SessionSigner("another-secret-of-16+", 3600)
        api.client.cookies.set(COOKIE_NAME, other_key.make(b"\0" * 32), path="/ui")
        assert (await api.client.get("/ui")).status_code == 303


def test_session_cookies_expire_and_csrf_tokens_belong_to_one_session() -> None:
    signer = SessionSigner("a-secret-of-sixteen-chars", ttl_s=60)
    cookie = signer.make(b"h" * 32, now=1000.0)
    session = signer.read(cookie, now=1059.0)
    assert session is not None and session.token_hash == b"h" * 32
    assert signer.read(cookie, now=1061.0) is None
    assert signer.read(cookie[:-2] + "AA", now=1000.0) is None
    assert signer.read("garbage", now=1000.0) is None
    other = signer.read(signer.make(b"h" * 32, now=1000.0), now=1000.0)
    assert other is not None
    assert signer.csrf_ok(session, signer.csrf_token(session))
    assert not signer.csrf_ok(session, signer.csrf_token(other))
    assert not signer.csrf_ok(session, None)


async def test_ui_false_turns_the_dashboard_off(db_url: str, token_a: str) -> None:
    async with running_api(settings_for(db_url), http_settings(ui=False)) as api:
        for path in ("/ui", "/ui/login", "/ui/static/ui.js"):
            assert (await api.client.get(path)).status_code == 404
        assert (await api.client.post("/ui/login", data={"token": token_a})).status_code == 404
        assert (await api.client.get("/healthz")).status_code == 200


async def test_the_overview_counts_by_queue_and_an_org_sees_its_own_jobs(
    db_url: str, token_a: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobsd.queues (name) VALUES ('mail')")
        make_jobs(conn, 2, org_id="acme", queue="mail")
        make_jobs(conn, 5, org_id="globex", queue="mail")
        # a capacity set below the open jobs: full (enqueues refused)
        conn.execute("UPDATE jobsd.queues SET paused_at = now(), capacity = 3 WHERE name = 'mail'")
        make_jobs(conn, 4, org_id="acme", status="succeeded", finished_at=sql.SQL("now()"))
        done = {"status": "failed", "finished_at": sql.SQL("now()")}
        make_job(conn, org_id="acme", error="boom: disk full", **done)
        make_job(conn, org_id="globex", error="globex secret", **done)
    async with running_api(settings_for(db_url)) as api:
        await login(api.client, token_a)
        html = (await api.client.get("/ui")).text
        mail = _row(html, "mail")
        assert _cells(mail)[:2] == ["mail", "2"]  # acme's 2 queued, not globex's 5
        assert "paused" in mail and "full" in mail and "cap 7/3" in mail
        default = _cells(_row(html, "default"))
        assert default[6:8] == ["4", "1"]  # succeeded and failed in the last hour
        assert "boom: disk full" in html and "globex secret" not in html
        assert "/ui/queues/mail/pause" not in html and "/ui/queues/mail/resume" not in html
        assert "Daemons are shown to operators" in html

        api.client.cookies.clear()
        await login(api.client, admin_token(db_url))
        html = (await api.client.get("/ui")).text
        assert _cells(_row(html, "mail"))[:2] == ["mail", "7"]
        assert "globex secret" in html
        assert "/ui/queues/mail/resume" in html
        assert "No daemon is registered" in html


def _row(html: str, queue: str) -> str:
    match = re.search(rf'<tr data-queue="{re.escape(queue)}">(.*?)</tr>', html, re.S)
    assert match, f"no row for queue {queue}"
    return match.group(1)


def _cells(row: str) -> list[str]:
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    return [re.sub(r"<[^>]+>", "", c).strip() for c in cells]


async def test_the_jobs_list_filters_and_pages_by_keyset(db_url: str, token_a: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        made = make_jobs(
            conn,
            60,
            org_id="acme",
            type="resize",
            created_at=sql.SQL("now() - make_interval(secs => g)"),
        )
        make_jobs(
            conn, 3, org_id="acme", type="mail", status="failed", finished_at=sql.SQL("now()")
        )
        other = make_job(conn, org_id="globex", type="resize")
    async with running_api(settings_for(db_url)) as api:
        await login(api.client, token_a)
        first = await api.client.get("/ui/jobs", params={"type": "resize"})
        ids = re.findall(r'<tr data-job="([^"]+)">', first.text)
        assert ids == [str(i) for i in made[:50]]  # newest first
        nxt = re.search(r'href="([^"]+)" rel="next"', first.text)
        assert nxt
        second = await api.client.get(nxt.group(1).replace("&amp;", "&"))
        assert re.findall(r'<tr data-job="([^"]+)">', second.text) == [str(i) for i in made[50:]]
        assert 'rel="next"' not in second.text

        failed = await api.client.get("/ui/jobs", params={"status": "failed"})
        assert len(re.findall(r'<tr data-job="', failed.text)) == 3
        # created in a window: 10 s to 20 s ago (times are UTC)
        now = time.time()
        window = {
            "since": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now - 20.5)),
            "until": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now - 9.5)),
            "type": "resize",
        }
        shown = re.findall(
            r'<tr data-job="', (await api.client.get("/ui/jobs", params=window)).text
        )
        assert 9 <= len(shown) <= 12

        # an org never sees another org's job, even when it asks for that org
        theirs = await api.client.get("/ui/jobs", params={"org": "globex"})
        assert str(other) not in theirs.text and "No job matches" in theirs.text
        assert (await api.client.get(f"/ui/jobs/{other}")).status_code == 404
        bad = await api.client.get("/ui/jobs", params={"status": "nope"})
        assert bad.status_code == 400 and "bad filter" in bad.text
        assert (await api.client.get("/ui/jobs", params={"cursor": "zz"})).status_code == 400

        api.client.cookies.clear()
        await login(api.client, admin_token(db_url))
        everyone = await api.client.get("/ui/jobs", params={"org": "globex"})
        assert re.findall(r'<tr data-job="([^"]+)">', everyone.text) == [str(other)]


async def test_the_job_page_shows_payload_progress_error_and_history(
    db_url: str, token_a: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        job = make_job(
            conn,
            org_id="acme",
            type="import_csv",
            status="failed",
            payload={"rows": 3000, "note": "<script>alert(1)</script>"},
            progress={"done": 750, "total": 3000},
            error="ValueError: bad row 751",
            reason="max attempts exceeded",
        )
    async with running_api(settings_for(db_url)) as api:
        await login(api.client, token_a)
        page = await api.client.get(f"/ui/jobs/{job}")
        assert page.status_code == 200
        html = page.text
        assert '"rows": 3000' in html
        assert "<script>alert(1)" not in html  # escaped
        assert '<progress id="progress" max="3000" value="750">' in html
        assert "ValueError: bad row 751" in html and "max attempts exceeded" in html
        timeline = re.findall(r'<span class="state (\w+)">', html.split("History")[1])
        assert timeline == ["queued", "queued", "running", "running", "failed"]
        live = await api.client.get(f"/ui/jobs/{job}/live")
        assert live.json() == {"status": "failed", "done": 750, "total": 3000}
        assert (await api.client.get("/ui/jobs/not-a-uuid")).status_code == 404


async def test_the_job_page_shows_a_reservation_while_the_job_is_queued(
    db_url: str, token_a: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        job = make_job(conn, org_id="acme")
        conn.execute(
            "UPDATE jobsd.jobs SET worker_id = 'host:42:a', lease_id = gen_random_uuid(), "
            "reserved_until = now() + interval '2 seconds' WHERE id = %s",
            (job,),
        )
    async with running_api(settings_for(db_url)) as api:
        await login(api.client, token_a)
        html = (await api.client.get(f"/ui/jobs/{job}")).text
        assert "<dt>reserved</dt><dd>by <code>host:42:a</code> until" in html
        assert '<span class="state queued">queued</span>' in html
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("UPDATE jobsd.jobs SET status = 'cancelled' WHERE id = %s", (job,))
        # a job cancelled while reserved keeps the column: no reservation is shown
        assert "<dt>reserved</dt>" not in (await api.client.get(f"/ui/jobs/{job}")).text


async def test_cancel_needs_the_csrf_token_and_is_recorded_with_its_actor(
    db_url: str, token_a: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        queued = make_job(conn, org_id="acme")
        running = make_job(conn, org_id="acme", status="running", claim=CLAIM)
        done = make_job(conn, org_id="acme", status="succeeded", claim=CLAIM)
        theirs = make_job(conn, org_id="globex")
    async with running_api(settings_for(db_url)) as api:
        csrf = await login(api.client, token_a)
        refused = await api.client.post(f"/ui/jobs/{queued}/cancel", data={"csrf": "forged"})
        assert refused.status_code == 403
        missing = await api.client.post(f"/ui/jobs/{queued}/cancel")
        assert missing.status_code == 403
        with psycopg.connect(db_url, autocommit=True) as conn:
            assert job_row(conn, queued)["status"] == "queued"  # type: ignore[index]

        ok = await api.client.post(f"/ui/jobs/{queued}/cancel", data={"csrf": csrf})
        assert ok.status_code == 303 and ok.headers["location"].startswith(f"/ui/jobs/{queued}?")
        last = events(db_url, queued)[-1]
        assert last["to_status"] == "cancelled"
        assert last["worker_id"].startswith("ui:acme:")
        assert last["reason"] == "cancelled from the dashboard"
        page = await api.client.get(ok.headers["location"])
        assert "cancelled from the dashboard" in page.text and "ui:acme:" in page.text

        asked = await api.client.post(f"/ui/jobs/{running}/cancel", data={"csrf": csrf})
        assert asked.status_code == 303 and "cancel+requested" in asked.headers["location"]
        with psycopg.connect(db_url, autocommit=True) as conn:
            row = job_row(conn, running)
        assert row is not None and row["status"] == "running" and row["cancel_requested_at"]
        note = events(db_url, running)[-1]
        assert (note["from_status"], note["to_status"]) == ("running", "running")
        assert note["worker_id"].startswith("ui:acme:")

        finished = await api.client.post(f"/ui/jobs/{done}/cancel", data={"csrf": csrf})
        assert finished.status_code == 409 and "already succeeded" in finished.text
        other = await api.client.post(f"/ui/jobs/{theirs}/cancel", data={"csrf": csrf})
        assert other.status_code == 404
        with psycopg.connect(db_url, autocommit=True) as conn:
            assert job_row(conn, theirs)["status"] == "queued"  # type: ignore[index]
            assert_history_complete(conn)


async def test_resolve_settles_a_recovery_required_job(db_url: str, token_a: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        stuck = make_job(conn, org_id="acme", status="recovery_required")
        fine = make_job(conn, org_id="acme")
    async with running_api(settings_for(db_url)) as api:
        csrf = await login(api.client, token_a)
        page = await api.client.get(f"/ui/jobs/{stuck}")
        assert f"/ui/jobs/{stuck}/resolve" in page.text
        bad = await api.client.post(
            f"/ui/jobs/{stuck}/resolve", data={"csrf": csrf, "outcome": "maybe"}
        )
        assert bad.status_code == 400
        ok = await api.client.post(
            f"/ui/jobs/{stuck}/resolve", data={"csrf": csrf, "outcome": "succeeded"}
        )
        assert ok.status_code == 303
        last = events(db_url, stuck)[-1]
        assert (last["from_status"], last["to_status"]) == ("recovery_required", "succeeded")
        assert last["worker_id"].startswith("ui:acme:")
        again = await api.client.post(
            f"/ui/jobs/{fine}/resolve", data={"csrf": csrf, "outcome": "failed"}
        )
        assert again.status_code == 409
        with psycopg.connect(db_url, autocommit=True) as conn:
            assert job_row(conn, fine)["status"] == "queued"  # type: ignore[index]


async def test_only_an_admin_pauses_and_resumes_a_queue(db_url: str, token_a: str) -> None:
    def paused() -> bool:
        with psycopg.connect(db_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT paused_at IS NOT NULL FROM jobsd.queues WHERE name = 'default'"
            ).fetchone()
        assert row is not None
        return bool(row[0])

    async with running_api(settings_for(db_url)) as api:
        csrf = await login(api.client, token_a)
        refused = await api.client.post("/ui/queues/default/pause", data={"csrf": csrf})
        assert refused.status_code == 403 and not paused()

        api.client.cookies.clear()
        csrf = await login(api.client, admin_token(db_url))
        assert (await api.client.post("/ui/queues/default/pause")).status_code == 403
        assert not paused()
        ok = await api.client.post("/ui/queues/default/pause", data={"csrf": csrf})
        assert ok.status_code == 303 and paused()
        assert "queue default paused" in (await api.client.get(ok.headers["location"])).text
        ok = await api.client.post("/ui/queues/default/resume", data={"csrf": csrf})
        assert ok.status_code == 303 and not paused()
        missing = await api.client.post("/ui/queues/nope/pause", data={"csrf": csrf})
        assert missing.status_code == 404
        logout = await api.client.post("/ui/logout", data={"csrf": csrf})
        assert logout.status_code == 303
        assert (await api.client.get("/ui")).status_code == 303


async def test_retry_makes_a_new_job_links_both_and_records_the_actor(
    db_url: str, token_a: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        failed = make_job(conn, org_id="acme", status="failed", claim=CLAIM, error="boom")
        queued = make_job(conn, org_id="acme")
        theirs = make_job(conn, org_id="globex", status="failed", claim=CLAIM)
    async with running_api(settings_for(db_url)) as api:
        csrf = await login(api.client, token_a)
        page = await api.client.get(f"/ui/jobs/{failed}")
        assert f"/ui/jobs/{failed}/retry" in page.text
        assert (await api.client.post(f"/ui/jobs/{failed}/retry")).status_code == 403
        ok = await api.client.post(f"/ui/jobs/{failed}/retry", data={"csrf": csrf})
        assert ok.status_code == 303, ok.text
        with psycopg.connect(db_url, autocommit=True) as conn:
            row = job_row(conn, failed)
            new = conn.execute("SELECT id FROM jobsd.jobs WHERE retry_of = %s", (failed,))
            new_id = new.fetchone()[0]  # type: ignore[index]
        assert ok.headers["location"].startswith(f"/ui/jobs/{new_id}?")
        last = events(db_url, failed)[-1]
        assert (last["from_status"], last["to_status"]) == ("failed", "failed")
        assert last["reason"] == f"retried as {new_id}"
        assert last["worker_id"].startswith("ui:acme:")
        assert row is not None and row["status"] == "failed" and row["attempts"] == 1
        # the pages link both ways; the retried job offers no second retry
        old_page = await api.client.get(f"/ui/jobs/{failed}")
        assert f'href="/ui/jobs/{new_id}"' in old_page.text
        assert f"/ui/jobs/{failed}/retry" not in old_page.text
        new_page = await api.client.get(f"/ui/jobs/{new_id}")
        assert f'href="/ui/jobs/{failed}"' in new_page.text and "A retry of" in new_page.text

        refused = await api.client.post(f"/ui/jobs/{queued}/retry", data={"csrf": csrf})
        assert refused.status_code == 409 and "only a failed or cancelled job" in refused.text
        other = await api.client.post(f"/ui/jobs/{theirs}/retry", data={"csrf": csrf})
        assert other.status_code == 404
        with psycopg.connect(db_url, autocommit=True) as conn:
            assert job_row(conn, theirs)["status"] == "failed"  # type: ignore[index]
            assert_history_complete(conn)


def test_the_dev_feeder_enqueues_every_example_type_until_stopped(db_url: str) -> None:
    from support.waiting import poll

    from jobsd.dev.demo import ExampleFeeder, dashboard_url

    def types() -> set[str] | None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            found = {r[0] for r in conn.execute("SELECT DISTINCT type FROM jobsd.jobs")}
        return found if {"map_reconcile", "import_csv", "always_fails"} <= found else None

    feeder = ExampleFeeder(db_url, interval_s=0.02)
    feeder.start()
    try:
        poll(types, what="the three example types enqueued", timeout_s=20)
    finally:
        feeder.stop()
    with psycopg.connect(db_url, autocommit=True) as conn:
        orgs = conn.execute("SELECT DISTINCT org_id FROM jobsd.jobs").fetchall()
    assert orgs == [("demo",)]
    assert dashboard_url("0.0.0.0:9000") == "http://127.0.0.1:9000/ui"
    assert dashboard_url("[::1]:9000") == "http://[::1]:9000/ui"


async def test_cross_site_posts_and_oversized_forms_are_refused(db_url: str, token_a: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        queued = make_job(conn, org_id="acme")
    async with running_api(settings_for(db_url)) as api:
        evil = {"Origin": "https://evil.example"}
        refused = await api.client.post("/ui/login", data={"token": token_a}, headers=evil)
        assert refused.status_code == 403 and COOKIE_NAME not in refused.cookies
        csrf = await login(api.client, token_a)
        cross = await api.client.post(
            f"/ui/jobs/{queued}/cancel", data={"csrf": csrf}, headers=evil
        )
        assert cross.status_code == 403
        big = await api.client.post(
            f"/ui/jobs/{queued}/cancel", data={"csrf": csrf, "pad": "x" * 5000}
        )
        assert big.status_code == 413
        junk = await api.client.post("/ui/jobs/not-a-uuid/cancel", data={"csrf": csrf})
        assert junk.status_code == 404
        with psycopg.connect(db_url, autocommit=True) as conn:
            assert job_row(conn, queued)["status"] == "queued"  # type: ignore[index]
        same = await api.client.post(
            f"/ui/jobs/{queued}/cancel",
            data={"csrf": csrf},
            headers={"Origin": "http://api.test"},
        )
        assert same.status_code == 303


async def test_pages_say_when_the_database_is_unavailable(db_url: str, token_a: str) -> None:
    secret = "one-key-for-both-processes"
    async with running_api(settings_for(db_url), http_settings(ui_secret=secret)) as api:
        await login(api.client, token_a)
        cookie = api.client.cookies[COOKIE_NAME]
    down = settings_for("postgresql://nobody@127.0.0.1:1/none")
    async with running_api(down, http_settings(ready_timeout=0.3, ui_secret=secret)) as api:
        answer = await api.client.post("/ui/login", data={"token": token_a})
        assert answer.status_code == 503 and "database is unavailable" in answer.text
        api.client.cookies.set(COOKIE_NAME, cookie, path="/ui")
        page = await api.client.get("/ui")  # a valid session; its token cannot be checked
        assert page.status_code == 503 and "database is unavailable" in page.text


def test_the_dev_token_is_an_admin_token_revoked_at_the_end(db_url: str) -> None:
    from jobsd.dev.demo import dashboard_token, revoke_dashboard_token

    made = dashboard_token(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT org_id, admin, revoked_at IS NULL FROM jobsd.api_tokens"
        ).fetchone()
        assert row == (None, True, True)  # an operator's token: no org
        revoke_dashboard_token(db_url, made)
        assert conn.execute("SELECT revoked_at IS NOT NULL FROM jobsd.api_tokens").fetchone() == (
            True,
        )
    # the database gone first: a warning, no exception
    revoke_dashboard_token("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1", made)


async def test_the_dashboard_under_the_api_role(db_url: str, token_a: str, roles: Any) -> None:
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(db_url, autocommit=True) as conn:
        mine = make_job(conn, org_id="acme", type="resize")
        theirs = make_job(conn, org_id="globex", type="resize")
        make_job(conn, org_id="acme", status="failed", claim=CLAIM, finished_at=sql.SQL("now()"))
    api_url = make_conninfo(db_url, user=roles.api)
    async with running_api(settings_for(api_url)) as api:
        csrf = await login(api.client, token_a)
        overview = await api.client.get("/ui")
        assert overview.status_code == 200
        assert _cells(_row(overview.text, "default"))[:2] == ["default", "1"]
        listed = await api.client.get("/ui/jobs", params={"type": "resize"})
        assert re.findall(r'<tr data-job="([^"]+)">', listed.text) == [str(mine)]
        assert (await api.client.get(f"/ui/jobs/{theirs}")).status_code == 404
        done = await api.client.post(f"/ui/jobs/{mine}/cancel", data={"csrf": csrf})
        assert done.status_code == 303, done.text
        assert events(db_url, mine)[-1]["worker_id"].startswith("ui:acme:")

        # an admin's every-org view needs a role that sees every org: here it says so
        api.client.cookies.clear()
        await login(api.client, admin_token(db_url))
        page = await api.client.get("/ui")
        assert page.status_code == 200, page.text
        assert "may not read jobsd.workers" in page.text
