"""The dashboard in a real browser: headless Chromium (the Debian package) driven by
Playwright, against the API served on a loopback socket with a daemon running jobs.

It logs in, watches a running job's progress bar move, cancels that job and reads
the cancel in its history, retries a failed job, pauses a queue, and checks that an
org's token sees neither another org's job nor the queue actions; no page logs a
console error. With ``JOBSD_UI_SCREENSHOTS=docs/ui`` it saves a PNG of each page
there (the pictures of docs/ui.md); otherwise into the test's temporary folder.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from apikit import http_settings, running_daemon, served_api, settings_for
from psycopg import sql
from support.jobs import make_job, make_jobs

import jobsd
from jobsd.ops import Caller
from jobsd.ops.tokens import create_token
from jobsd.registry import Registry

OPERATOR = Caller.as_operator("tests")

CHROMIUM = os.environ.get("JOBSD_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason="chromium is not installed (apt-get install chromium; .ci/run installs it)",
    ),
]

CLAIM = {"attempts": sql.SQL("attempts + 1"), "worker_id": "w-old"}
STEPS = 400  # the slow job: 400 steps of 50 ms, 20 s unless cancelled


def make_registry() -> Registry:
    reg = Registry()

    @jobsd.handler("import_csv", registry=reg)
    async def import_csv(ctx: jobsd.JobContext) -> dict[str, Any]:
        for done in range(1, STEPS + 1):
            await anyio.sleep(0.05)
            await ctx.progress(done=done, total=STEPS)
        return {"rows": STEPS}

    @jobsd.handler("send_mail", registry=reg)
    async def send_mail(ctx: jobsd.JobContext) -> dict[str, Any]:
        return {"sent": True}

    return reg


def token(db_url: str, org_id: str, *, admin: bool = False) -> str:
    with psycopg.connect(db_url, autocommit=True) as conn:
        made, _ = create_token(conn, OPERATOR, None if admin else org_id, "browser", admin=admin)
    return made


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("JOBSD_UI_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Browser:
    """One Chromium page, its console errors, and screenshots by name."""

    def __init__(self, page: Any, base: str, shots: Path) -> None:
        self.page, self.base, self.shots = page, base, shots
        self.console_errors: list[str] = []
        self.expected_failures: set[str] = set()
        self.confirmations: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.console_errors.append(f"page error: {exc}"))
        page.on("dialog", self._confirm)

    async def _confirm(self, dialog: Any) -> None:
        self.confirmations.append(dialog.message)
        await dialog.accept()  # every confirmation: yes

    def _console(self, message: Any) -> None:
        if message.type != "error":
            return
        where = message.location.get("url", "")
        if where.removeprefix(self.base) in self.expected_failures:
            return  # a 403/404 the test asked for
        self.console_errors.append(f"{message.text} at {where}")

    async def goto(self, path: str) -> Any:
        return await self.page.goto(self.base + path)

    async def shot(self, name: str) -> None:
        await self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)

    async def login(self, secret: str) -> None:
        await self.goto("/ui/login")
        await self.page.fill("#token", secret)
        await self.page.click("button[type=submit]")
        await self.page.wait_for_url(self.base + "/ui")


async def progress_value(bar: Any) -> int:
    """Return the progress bar's value (0 while there is none)."""
    if await bar.count() == 0:
        return 0
    return int(await bar.get_attribute("value") or 0)


async def until(read: Any, holds: Any, timeout_s: float = 15.0) -> Any:
    """Poll ``read()`` every 100 ms until ``holds(value)``; return the value.

    (Playwright's wait_for_function evaluates a string, which the dashboard's
    Content-Security-Policy forbids.)
    """
    with anyio.fail_after(timeout_s):
        while True:
            value = await read()
            if holds(value):
                return value
            await anyio.sleep(0.1)


@pytest.fixture
async def chromium() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield browser
        finally:
            await browser.close()


def seed(db_url: str) -> dict[str, uuid.UUID]:
    """Jobs for the pages to show: an hour of finished work, a failed job, a queue."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobsd.queues (name, capacity) VALUES ('mail', 500)")
        make_jobs(
            conn,
            120,
            org_id="acme",
            type="send_mail",
            queue="mail",
            status="succeeded",
            claim=CLAIM,
            created_at=sql.SQL("now() - make_interval(secs => (g * 29) % 3500 + 2)"),
            finished_at=sql.SQL("now() - make_interval(secs => (g * 29) % 3500)"),
        )
        make_jobs(
            conn,
            6,
            org_id="acme",
            type="send_mail",
            queue="mail",
            status="failed",
            claim=CLAIM,
            error="SMTPRecipientsRefused: mailbox unavailable",
            created_at=sql.SQL("now() - make_interval(mins => g * 7, secs => 30)"),
            finished_at=sql.SQL("now() - make_interval(mins => g * 7)"),
        )
        failed = make_job(
            conn,
            org_id="acme",
            type="send_mail",
            queue="mail",
            status="failed",
            claim=CLAIM,
            payload={"to": "ops@example.com"},
            error="SMTPServerDisconnected: Connection unexpectedly closed",
            finished_at=sql.SQL("now()"),
        )
        # the cause, as the daemon writes it with the final state (no event of its own)
        conn.execute(
            "UPDATE jobsd.jobs SET reason = 'max attempts exceeded' WHERE status = 'failed'"
        )
        theirs = make_job(conn, org_id="globex", type="send_mail", queue="mail", status="queued")
        conn.execute("UPDATE jobsd.queues SET paused_at = now() WHERE name = 'mail'")
    return {"failed": failed, "theirs": theirs}


async def test_the_dashboard_in_chromium(db_url: str, chromium: Any, shots: Path) -> None:
    jobs = seed(db_url)
    admin, acme = token(db_url, "acme", admin=True), token(db_url, "acme")
    settings = settings_for(db_url)
    async with (
        running_daemon(settings, make_registry()) as daemon,
        served_api(settings, http_settings(), daemon=daemon) as (base, _),
    ):
        with psycopg.connect(db_url, autocommit=True) as conn:
            slow = make_job(
                conn, org_id="acme", type="import_csv", payload={"file": "customers.csv"}
            )
        context = await chromium.new_context(viewport={"width": 1280, "height": 800})
        b = Browser(await context.new_page(), base, shots)

        # log in: the page asks for a token, the session is a cookie
        await b.goto("/ui")
        assert b.page.url == base + "/ui/login"
        await b.shot("login")
        await b.login(admin)
        cookies = await context.cookies()
        assert [(c["name"], c["httpOnly"], c["sameSite"]) for c in cookies] == [
            ("jobsd_session", True, "Strict")
        ]
        assert admin not in b.page.url

        # the running job's progress bar moves (the page refreshes itself)
        await b.goto(f"/ui/jobs/{slow}")
        bar = b.page.locator("#progress")
        first = await until(lambda: progress_value(bar), lambda v: v > 0)
        moved = await until(lambda: progress_value(bar), lambda v: v > first)
        assert moved > first
        # its silence is shown: short, since the handler reports progress
        silence = await b.page.locator("#silence").inner_text()
        assert "since the handler's last progress" in silence, silence
        await b.shot("job-running")

        # overview: the queues, the chart, the daemon
        await b.goto("/ui")
        mail = b.page.locator('tr[data-queue="mail"]')
        assert "paused" in await mail.inner_text()
        assert await mail.locator("svg.chart rect").count() > 10
        assert daemon.settings.worker_id in await b.page.locator("body").inner_text()
        # who is logged in: an operator's token belongs to no org (issue 13)
        assert await b.page.locator(".who .org").inner_text() == "every org"
        await b.shot("overview")

        # cancel the running job; the cancel shows in its history with the actor
        await b.goto(f"/ui/jobs/{slow}")
        await b.page.click("form[action$='/cancel'] button")
        await b.page.wait_for_selector("p.flash")
        await b.page.wait_for_selector("h1 .state.cancelled", timeout=15_000)
        history = await b.page.locator("ol.timeline").inner_text()
        assert "cancel requested" in history
        assert re.search(r"running\s*→\s*cancelled", history)
        assert "ui:operator:" in history
        await b.shot("job-cancelled")

        # retry a failed job: a new job, linked both ways, recorded with the actor
        await b.goto(f"/ui/jobs/{jobs['failed']}")
        await b.shot("job-failed")
        await b.page.click("form[action$='/retry'] button")
        await b.page.wait_for_selector("p.flash")
        assert f"retry of job {jobs['failed']}" in await b.page.locator("p.flash").inner_text()
        assert str(jobs["failed"]) in await b.page.locator("#retry-of").inner_text()
        history = await b.page.locator("ol.timeline").inner_text()
        assert f"retry of {jobs['failed']}" in history and "ui:operator:" in history
        await b.shot("job-retried")
        await b.page.click("#retry-of a")
        await b.page.wait_for_selector("#retried-as")
        assert await b.page.locator("form[action$='/retry']").count() == 0
        history = await b.page.locator("ol.timeline").inner_text()
        assert re.search(r"failed\s*→\s*failed", history) and "retried as" in history

        # pause, then resume, a queue
        await b.goto("/ui")
        await b.page.click("tr[data-queue='default'] form[action$='/pause'] button")
        await b.page.wait_for_selector("p.flash")
        assert "paused" in await b.page.locator('tr[data-queue="default"]').inner_text()
        with psycopg.connect(db_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT paused_at IS NOT NULL FROM jobsd.queues WHERE name = 'default'"
            ).fetchone()
        assert row == (True,)
        await b.page.click("tr[data-queue='default'] form[action$='/resume'] button")
        await b.page.wait_for_selector("p.flash")

        # the jobs list, filtered
        await b.goto("/ui/jobs?queue=mail")
        assert await b.page.locator("table.jobs tbody tr").count() == 50
        assert await b.page.locator("a[rel=next]").count() == 1
        await b.shot("jobs")

        # an org's token: its own jobs only, no queue actions
        org = await chromium.new_context(viewport={"width": 1280, "height": 800})
        o = Browser(await org.new_page(), base, shots)
        await o.login(acme)
        assert await o.page.locator("form[action^='/ui/queues/']").count() == 0
        o.expected_failures = {f"/ui/jobs/{jobs['theirs']}"}
        answer = await o.goto(f"/ui/jobs/{jobs['theirs']}")
        assert answer.status == 404
        await o.goto("/ui/jobs?org=globex")
        assert await o.page.locator("table.jobs tbody tr").count() == 0
        await o.goto("/ui")
        csrf = await o.page.locator("input[name=csrf]").first.get_attribute("value")
        refused = await o.page.request.post(
            base + "/ui/queues/mail/resume", form={"csrf": csrf or ""}, max_redirects=0
        )
        status = refused.status
        assert status == 403
        assert await o.page.locator(".who .org").inner_text() == "acme"
        await o.shot("overview-org")
        with psycopg.connect(db_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT paused_at IS NOT NULL FROM jobsd.queues WHERE name = 'mail'"
            ).fetchone()
        assert row == (True,), "an org's token resumed a queue"
        await org.close()
        await context.close()
        # each action asked first: cancel, retry, pause, resume
        assert [m.split()[0] for m in b.confirmations] == ["Cancel", "Retry", "Pause", "Resume"]
        assert b.console_errors == [] and o.console_errors == [], (
            b.console_errors + o.console_errors
        )
