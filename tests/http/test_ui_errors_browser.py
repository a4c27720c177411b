"""The errors of each attempt on the job page, in a real browser (headless Chromium, as
test_ui_browser.py drives it): each traceback is a block of several lines, in its own
box, at a desktop's width and at a phone's (390 px)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from apikit import served_api, settings_for
from test_http_error_records import failed_three_times
from test_ui_browser import CHROMIUM, Browser, chromium, shots, token

__all__ = ["chromium", "shots"]  # fixtures of test_ui_browser.py, used here by name

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason="chromium is not installed (apt-get install chromium; .ci/run installs it)",
    ),
]


async def test_tracebacks_show_as_lines_in_their_box(
    db_url: str, chromium: Any, shots: Path
) -> None:
    job = await failed_three_times(db_url)
    tracebacks = [e.traceback or "" for e in job.errors]
    secret = token(db_url, "acme")
    async with served_api(settings_for(db_url)) as (base, _):
        for width, name in ((1280, "job-errors"), (390, "job-errors-phone")):
            context = await chromium.new_context(viewport={"width": width, "height": 800})
            b = Browser(await context.new_page(), base, shots)
            await b.login(secret)
            await b.goto(f"/ui/jobs/{job.id}")
            items = b.page.locator("li.attempt-error")
            assert await items.count() == 3
            assert [await items.nth(i).get_attribute("data-attempt") for i in range(3)] == [
                "3",
                "2",
                "1",
            ]
            for i, expected in enumerate(tracebacks):
                pre = items.nth(i).locator("pre.traceback")
                text = await pre.inner_text()
                assert "\n" in text and text.strip() == expected.strip()
                box = await pre.bounding_box()
                assert box is not None
                line_px = await line_height(pre)
                lines = expected.count("\n")
                assert box["height"] > 3 * line_px, (box, line_px)
                # every line on a line of its own (up to the box's own height cap)
                assert box["height"] >= min(lines * line_px, 400), (box, line_px, lines)
                # the box stays inside the page: a long line scrolls within it
                assert box["x"] >= 0 and box["x"] + box["width"] <= width, (box, width)
                family = await pre.evaluate("el => getComputedStyle(el).fontFamily")
                assert "monospace" in family
            report = b.page.locator("#report-traceback")
            assert "\n" in await report.inner_text()
            await b.shot(name)
            assert b.console_errors == [], b.console_errors
            await context.close()


async def line_height(locator: Any) -> float:
    """Return the element's line height in CSS pixels."""
    value = await locator.evaluate("el => getComputedStyle(el).lineHeight")
    if value.endswith("px"):
        return float(value[:-2])
    size = await locator.evaluate("el => getComputedStyle(el).fontSize")
    return 1.2 * float(size.removesuffix("px"))
