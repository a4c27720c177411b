"""The schedules and job-type pages in a real browser, and every page at a phone's width.

Headless Chromium (the Debian package) driven by Playwright, against the API served on
a loopback socket, with the helpers of test_ui_browser.py. An operator opens the
schedules page and pauses a schedule, then the types page and one type's page, and
reads their figures; then, at 390 x 844 px, every page (login, overview, jobs, a job,
schedules, types, a type) is checked for a horizontal page scroll. With
``JOBSD_UI_SCREENSHOTS=docs/ui`` each page is saved there as a PNG (``schedules``,
``types``, ``type``, ``phone-*``); otherwise into the test's temporary folder.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apikit import http_settings, served_api, settings_for
from support.jobs import make_job
from test_ui_browser import CHROMIUM, Browser, chromium, seed, shots, token

from jobsd.ops import Caller
from jobsd.ops.schedules import pause_schedule
from jobsd.periodic import Schedule
from jobsd.worker.clock import ManualClock
from jobsd.worker.scheduler import Scheduler, SchedulerSettings

__all__ = ["chromium", "shots"]  # the fixtures, imported from test_ui_browser

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason="chromium is not installed (apt-get install chromium; .ci/run installs it)",
    ),
]

PHONE = {"width": 390, "height": 844}


def seed_runs(db_url: str) -> None:
    """A day of resize_image runs (40 ms to 4 s, one in nine failed) and a few report
    runs, most of them archived, as the daemons leave them."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        now: datetime = row[0]
        for i in range(90):
            ago = timedelta(seconds=30 + (i * 37) % 3300 if i % 3 else 3600 + i * 900)
            run = timedelta(seconds=0.04 * 1.05**i)
            finished = now - ago
            make_job(
                conn,
                status="failed" if i % 9 == 4 else "succeeded",
                org_id="acme" if i % 4 else "globex",
                type="resize_image",
                queue="default",
                error="PIL.UnidentifiedImageError: cannot identify image" if i % 9 == 4 else None,
                created_at=finished - run - timedelta(seconds=2),
                run_after=finished - run - timedelta(seconds=2),
                started_at=finished - run,
                finished_at=finished,
            )
        for i in range(6):
            finished = now - timedelta(minutes=9 * i + 3)
            make_job(
                conn,
                status="succeeded",
                org_id="acme",
                type="nightly_report",
                created_at=finished - timedelta(seconds=80),
                run_after=finished - timedelta(seconds=80),
                started_at=finished - timedelta(seconds=70 + i),
                finished_at=finished,
            )
        conn.execute("SELECT jobsd.archive_move(1000, 60)")


async def declare_schedules(pool: Any) -> None:
    """Three schedules that fired a tick a minute (or none) for 15 minutes; the nightly
    one paused."""
    schedules = [
        Schedule.build(id="cleanup-tmp", type="cleanup", org_id="acme", every="5m"),
        Schedule.build(
            "0 3 * * *", id="nightly-report", type="nightly_report", org_id="acme",
            timezone="Europe/Paris",
        ),
        Schedule.build(id="sync-crm", type="sync_crm", org_id="globex", every="60s"),
    ]  # fmt: skip
    clock = ManualClock(datetime.now(UTC) - timedelta(minutes=16))
    scheduler = Scheduler(pool, SchedulerSettings(worker_id="browser"), clock, schedules)
    for _ in range(16):
        await scheduler.run_once()
        clock.advance(60)
    async with pool.connection() as conn:
        await pause_schedule(conn, Caller.as_operator("tests"), "nightly-report")


def fired(db_url: str, schedule_id: str) -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT fired FROM jobsd.schedules WHERE id = %s", (schedule_id,))
        found = row.fetchone()
    assert found is not None
    return int(found[0])


async def page_width(b: Browser) -> int:
    return int(await b.page.evaluate("document.documentElement.scrollWidth"))


async def test_schedules_and_types_in_chromium_and_every_page_at_a_phones_width(
    db_url: str, chromium: Any, shots: Path
) -> None:
    jobs = seed(db_url)
    seed_runs(db_url)
    settings = settings_for(db_url)
    admin, acme = token(db_url, "acme", admin=True), token(db_url, "acme")
    async with served_api(settings, http_settings()) as (base, backend):
        await declare_schedules(backend.pool)
        context = await chromium.new_context(viewport={"width": 1280, "height": 800})
        b = Browser(await context.new_page(), base, shots)
        await b.login(admin)

        # schedules: cadence, next and last tick, counters; pause one, it shows paused
        await b.goto("/ui/schedules")
        rows = b.page.locator("table.schedules tbody tr")
        assert await rows.count() == 3
        cleanup = b.page.locator('tr[data-schedule="cleanup-tmp"]')
        text = await cleanup.inner_text()
        assert "every 5m" in text and "queued" in text and "active" in text
        assert await cleanup.locator("a[href^='/ui/jobs/']").count() == 1
        nightly = await b.page.locator('tr[data-schedule="nightly-report"]').inner_text()
        assert "paused" in nightly and "0 3 * * * (Europe/Paris)" in nightly
        sync = b.page.locator('tr[data-schedule="sync-crm"]')
        counters = [c.strip() for c in await sync.locator("td").all_inner_texts()][6:10]
        assert counters == [str(fired(db_url, "sync-crm")), "0", "0", "0"]
        assert int(counters[0]) >= 14  # a tick a minute
        await sync.locator("form[action$='/pause'] button").click()
        await b.page.wait_for_selector("p.flash")
        assert "schedule sync-crm paused" in await b.page.locator("p.flash").inner_text()
        assert "paused" in await b.page.locator('tr[data-schedule="sync-crm"]').inner_text()
        await b.shot("schedules")

        # the types: each one's figures, the chart, links to its jobs
        await b.goto("/ui/types")
        resize = b.page.locator('tr[data-type="resize_image"]')
        cells = [c.strip() for c in await resize.locator("td").all_inner_texts()]
        assert int(cells[1]) > 0 and int(cells[6]) == 90  # ended in the hour, in the day
        assert "%" in cells[3] and re.search(r"\d+ ms|\d\.\d s", cells[4])
        assert await resize.locator("svg.chart rect").count() > 5
        assert await b.page.locator('tr[data-type="nightly_report"]').count() == 1
        await b.shot("types")
        await resize.locator("td a").first.click()
        await b.page.wait_for_url(base + "/ui/types/resize_image")
        day = await b.page.locator('section[data-window="day"]').inner_text()
        assert re.search(r"ended\s+90\b", day) and "failure rate" in day
        assert re.search(r"run time p95\s+\d", day)
        assert await b.page.locator("svg.chart.wide rect").count() > 5
        await b.shot("type")
        await b.page.click("text=failed ones")
        await b.page.wait_for_url(re.compile(r".*/ui/jobs\?type=resize_image&status=failed$"))
        assert await b.page.locator("table.jobs tbody tr").count() == 10

        # a phone: every page fits its width (tables scroll in their own box)
        phone = await chromium.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
        p = Browser(await phone.new_page(), base, shots)
        await p.goto("/ui/login")
        assert await page_width(p) <= PHONE["width"], "login"
        await p.shot("phone-login")
        await p.login(admin)
        pages = {
            "overview": "/ui",
            "jobs": "/ui/jobs",
            "job": f"/ui/jobs/{jobs['failed']}",
            "schedules": "/ui/schedules",
            "types": "/ui/types",
            "type": "/ui/types/resize_image",
        }
        for name, path in pages.items():
            await p.goto(path)
            assert await page_width(p) <= PHONE["width"], name
            # the navigation wraps within the width, every link on screen
            for link in await p.page.locator("header.top nav a").all():
                box = await link.bounding_box()
                assert box is not None and box["x"] + box["width"] <= PHONE["width"], name
            await p.shot(f"phone-{name}")

        # an org's token: its own types only, and no schedules
        org = await chromium.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
        o = Browser(await org.new_page(), base, shots)
        await o.login(acme)
        assert await o.page.locator("header.top nav a[href='/ui/schedules']").count() == 0
        await o.goto("/ui/types")
        assert await page_width(o) <= PHONE["width"]
        day_ended = await o.page.locator('tr[data-type="resize_image"] td').nth(6).inner_text()
        assert 0 < int(day_ended) < 90  # globex's runs are not acme's
        o.expected_failures = {"/ui/schedules"}
        assert (await o.goto("/ui/schedules")).status == 403
        for ctx in (org, phone, context):
            await ctx.close()
        assert [m.split()[0] for m in b.confirmations] == ["Pause"]
        assert b.console_errors == [] and p.console_errors == [] and o.console_errors == [], (
            b.console_errors + p.console_errors + o.console_errors
        )
