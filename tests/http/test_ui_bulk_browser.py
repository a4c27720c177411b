"""The dashboard's bulk retry in a real browser (headless Chromium through Playwright, the
helpers of test_ui_browser.py): the jobs page filtered by failed offers "Retry all N
matching", the browser asks for a confirmation, and the summary page reads what was done."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from apikit import http_settings, served_api, settings_for
from psycopg import sql
from support.jobs import make_jobs
from test_ui_browser import CHROMIUM, Browser, token
from test_ui_browser import chromium as chromium
from test_ui_browser import shots as shots

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


async def test_retry_all_failed_jobs_from_the_jobs_page(
    db_url: str, chromium: Any, shots: Path
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        failed = make_jobs(conn, 5, org_id="acme", type="send_mail", status="failed", claim=CLAIM)
        make_jobs(conn, 2, org_id="acme", type="import_csv", status="failed", claim=CLAIM)
    admin = token(db_url, "acme", admin=True)
    async with served_api(settings_for(db_url), http_settings()) as (base, _):
        context = await chromium.new_context(viewport={"width": 1280, "height": 800})
        b = Browser(await context.new_page(), base, shots)
        await b.login(admin)

        await b.goto("/ui/jobs?status=failed&type=send_mail")
        button = b.page.get_by_role("button", name="Retry all 5 matching")
        assert await button.count() == 1
        await b.shot("jobs-bulk-offer")
        await button.click()  # the confirmation is accepted (Browser answers yes)
        await b.page.wait_for_url(base + "/ui/bulk/retry")
        summary = await b.page.locator("[data-bulk-summary]").inner_text()
        assert summary.startswith("5 matched, 5 retried, 0 still match"), summary
        assert await b.page.locator('[data-bulk="done"]').inner_text() == "5"
        assert b.confirmations and b.confirmations[0].startswith("Retry 5 jobs?")
        await b.shot("jobs-bulk-done")

        # back to the list: nothing left to retry there, the new jobs are queued
        await b.page.get_by_role("link", name="Back to the jobs").click()
        await b.page.wait_for_url(base + "/ui/jobs?status=failed&type=send_mail")
        assert await b.page.get_by_role("button", name="Retry all 5 matching").count() == 0
        assert b.console_errors == []
        await context.close()
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT retry_of, status FROM jobsd.jobs WHERE retry_of IS NOT NULL"
        ).fetchall()
    assert {r[0] for r in rows} == set(failed) and {r[1] for r in rows} == {"queued"}
