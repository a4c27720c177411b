"""The dashboard's schedules and job-type pages, in-process against a real Postgres: what
an operator and an org's token see, the pause and resume of a schedule, the figures of
each type and their scope, and the pages under the API's least-privilege role."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from apikit import running_api, settings_for, ui_login
from support.jobs import make_job

from jobsd.admin.queues import create_queue
from jobsd.ops import Caller
from jobsd.ops.tokens import create_token
from jobsd.periodic import Schedule
from jobsd.worker.clock import ManualClock
from jobsd.worker.scheduler import Scheduler, SchedulerSettings

OPERATOR = Caller.as_operator("tests")

pytestmark = pytest.mark.anyio


def admin_token(db_url: str) -> str:
    with psycopg.connect(db_url, autocommit=True) as conn:
        token, _ = create_token(conn, OPERATOR, None, "ui", admin=True)
    return token


def row_of(html: str, attribute: str, key: str) -> str:
    match = re.search(rf'<tr {attribute}="{re.escape(key)}">(.*?)</tr>', html, re.S)
    assert match, f"no row {attribute}={key}"
    return match.group(1)


def cells(row: str) -> list[str]:
    found = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    return [" ".join(re.sub(r"<[^>]+>", " ", c).split()) for c in found]


def paused(db_url: str, schedule_id: str) -> bool:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT paused FROM jobsd.schedules WHERE id = %s", (schedule_id,)
        ).fetchone()
    assert row is not None
    return bool(row[0])


async def test_the_schedules_page_shows_every_schedule_and_an_operator_pauses_one(
    db_url: str, token_a: str
) -> None:
    beat = Schedule.build(id="beat", type="beat", org_id="acme", every="60s")
    nightly = Schedule.build(
        "0 3 * * *", id="nightly", type="report", org_id="globex", timezone="Europe/Paris"
    )
    full = Schedule.build(id="full", type="t", org_id="acme", every="60s", queue="tiny")
    start = datetime.now(UTC).replace(second=30, microsecond=0) - timedelta(minutes=5)
    clock = ManualClock(start)
    async with running_api(settings_for(db_url)) as api:
        async with api.backend.pool.connection() as conn:
            await create_queue(conn, "tiny", capacity=1)
        scheduler = Scheduler(
            api.backend.pool, SchedulerSettings(worker_id="w"), clock, [beat, nightly, full]
        )
        await scheduler.run_once()
        for _ in range(2):  # beat fires twice; full once, then it is refused
            clock.advance(60)
            await scheduler.run_once()
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE jobsd.schedules SET paused = true, paused_at = now() WHERE id = 'nightly'"
            )
            # beat's last job ended and was archived: its state is still shown
            last = conn.execute("SELECT last_job_id FROM jobsd.schedules WHERE id = 'beat'")
            beat_job = last.fetchone()[0]  # type: ignore[index]
            conn.execute(
                "UPDATE jobsd.jobs SET status = 'running', started_at = now(), attempts = 1,"
                " worker_id = 'w' WHERE id = %s",
                (beat_job,),
            )
            conn.execute(
                "UPDATE jobsd.jobs SET status = 'succeeded', finished_at = now() WHERE id = %s",
                (beat_job,),
            )
            assert conn.execute("SELECT jobsd.archive_move(100, 0)").fetchone() == (1,)

        csrf = await ui_login(api.client, admin_token(db_url))
        page = await api.client.get("/ui/schedules")
        assert page.status_code == 200, page.text
        html = page.text
        assert 'href="/ui/schedules" aria-current="page"' in html
        assert re.findall(r'<tr data-schedule="([^"]+)">', html) == ["beat", "full", "nightly"]
        b = cells(row_of(html, "data-schedule", "beat"))
        assert b[:3] == ["beat", "beat acme · default", "every 1m"]
        assert "UTC" in b[3] and "in " in b[3]  # the next tick, and how soon
        assert "succeeded" in b[4] and f'/ui/jobs/{beat_job}"' in row_of(
            html, "data-schedule", "beat"
        )
        assert b[5:10] == ["active", "2", "0", "0", "0"]
        f = cells(row_of(html, "data-schedule", "full"))
        assert "refused" in f[4] and "is full" in f[4]
        assert f[5:10] == ["active", "1", "1", "0", "0"]
        n = row_of(html, "data-schedule", "nightly")
        assert cells(n)[2] == "0 3 * * * (Europe/Paris)"
        assert cells(n)[3] == "\N{EN DASH}" and cells(n)[4] == "never"
        assert cells(n)[5] == "paused" and "/ui/schedules/nightly/resume" in n
        assert "/ui/schedules/beat/pause" in row_of(html, "data-schedule", "beat")

        # pause: a form with the session's CSRF token, recorded as `jobsd schedule pause`
        refused = await api.client.post("/ui/schedules/beat/pause")
        assert refused.status_code == 403 and not paused(db_url, "beat")
        done = await api.client.post("/ui/schedules/beat/pause", data={"csrf": csrf})
        assert done.status_code == 303 and paused(db_url, "beat")
        shown = await api.client.get(done.headers["location"])
        assert "schedule beat paused" in shown.text
        assert "paused" in cells(row_of(shown.text, "data-schedule", "beat"))[5]
        again = await api.client.post("/ui/schedules/beat/resume", data={"csrf": csrf})
        assert again.status_code == 303 and not paused(db_url, "beat")
        with psycopg.connect(db_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT paused_at, resumed_at FROM jobsd.schedules WHERE id = 'beat'"
            ).fetchone()
        assert row is not None and row[0] is None and row[1] is not None
        missing = await api.client.post("/ui/schedules/nope/pause", data={"csrf": csrf})
        assert missing.status_code == 404 and "unknown schedule &#39;nope&#39;" in missing.text

        # an org's token: schedules are every org's, an operator's (as GET /schedules)
        api.client.cookies.clear()
        csrf = await ui_login(api.client, token_a)
        assert 'href="/ui/schedules"' not in (await api.client.get("/ui")).text
        page = await api.client.get("/ui/schedules")
        assert page.status_code == 403 and "only an operator may" in page.text
        assert "nightly" not in page.text
        pause = await api.client.post("/ui/schedules/beat/pause", data={"csrf": csrf})
        assert pause.status_code == 403 and not paused(db_url, "beat")


def ended(
    conn: psycopg.Connection[Any],
    now: datetime,
    *,
    org: str,
    type: str,
    status: str,
    ago_s: float,
    run_s: float,
) -> uuid.UUID:
    finished = now - timedelta(seconds=ago_s)
    started = finished - timedelta(seconds=run_s)
    return make_job(
        conn,
        status=status,
        org_id=org,
        type=type,
        created_at=started,
        run_after=started,
        started_at=started,
        finished_at=finished,
    )


def seed_types(db_url: str) -> None:
    """acme: resize (8 succeeded at 0.2 s, 2 failed at 3 s, one of them 3 h ago) and
    a/b (a type with a slash); globex: secret_report. Most archived, two not yet."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        now = row[0]
        for i in range(8):
            ended(
                conn,
                now,
                org="acme",
                type="resize",
                status="succeeded",
                ago_s=300 + 60 * i,
                run_s=0.2,
            )
        ended(conn, now, org="acme", type="resize", status="failed", ago_s=400, run_s=3.0)
        ended(conn, now, org="acme", type="resize", status="failed", ago_s=3 * 3600, run_s=3.0)
        ended(conn, now, org="acme", type="a/b", status="succeeded", ago_s=200, run_s=1.0)
        ended(
            conn, now, org="globex", type="secret_report", status="succeeded", ago_s=200, run_s=1.0
        )
        assert conn.execute("SELECT jobsd.archive_move(100, 60)").fetchone() == (12,)
        # not archived yet: counted from jobsd.jobs
        ended(conn, now, org="acme", type="resize", status="succeeded", ago_s=1, run_s=0.2)
        ended(conn, now, org="globex", type="secret_report", status="failed", ago_s=1, run_s=1)


async def test_the_type_pages_show_each_types_figures_within_the_viewers_org(
    db_url: str, token_a: str
) -> None:
    seed_types(db_url)
    async with running_api(settings_for(db_url)) as api:
        await ui_login(api.client, token_a)
        page = await api.client.get("/ui/types")
        assert page.status_code == 200, page.text
        html = page.text
        assert re.findall(r'<tr data-type="([^"]+)">', html) == ["a/b", "resize"]
        assert "secret_report" not in html
        resize = row_of(html, "data-type", "resize")
        # last hour: 10 ended (9 succeeded, 1 failed); last day: 11 (2 failed)
        # runs of 0.2 s fall in the bucket [181, 256) ms, of 3 s in [2.90, 4.10) s: the
        # percentiles are interpolated in them (the hour's p50: rank 5 of its 9 runs there)
        assert cells(resize)[1:11] == [
            "10", "0.2", "1 (10 %)", "219 ms", "3.4 s", "11", "0.5", "2 (18 %)", "224 ms", "3.7 s"
        ]  # fmt: skip
        assert 'href="/ui/jobs?type=resize&amp;status=failed"' in resize
        assert 'href="/ui/types/resize"' in resize
        assert 'class="ok"/>' in resize and 'class="bad"/>' in resize  # the chart's bars
        assert 'href="/ui/types/a%2Fb"' in html

        one = await api.client.get("/ui/types/resize")
        assert one.status_code == 200, one.text
        hour = re.search(r'data-window="hour".*?</section>', one.text, re.S)
        assert hour is not None
        facts = dict(re.findall(r"<dt>(.*?)</dt><dd[^>]*>(.*?)</dd>", hour.group(0), re.S))
        assert facts["ended"] == "10" and facts["succeeded"] == "9"
        assert ">1</a>" in facts["failed"] and "10 % failure rate" in facts["failed"]
        assert facts["throughput"] == "0.2 / min"
        assert "svg" in one.text and 'class="chart wide"' in one.text
        slash = await api.client.get("/ui/types/a%2Fb")
        assert slash.status_code == 200 and "Jobs of this type" in slash.text
        assert 'href="/ui/jobs?type=a%2Fb"' in slash.text

        # another org's type, or another org's figures: nothing, as in the jobs list
        theirs = await api.client.get("/ui/types/secret_report")
        assert theirs.status_code == 200 and "No job of type secret_report ended" in theirs.text
        other = await api.client.get("/ui/types", params={"org": "globex"})
        assert "No job ended in the last day" in other.text
        bad = await api.client.get("/ui/types", params={"org": "x" * 300})
        assert bad.status_code == 400 and "bad filter" in bad.text
        assert (await api.client.get("/ui/types/")).status_code == 404

        # an operator: every org, or one
        api.client.cookies.clear()
        await ui_login(api.client, admin_token(db_url))
        html = (await api.client.get("/ui/types")).text
        assert re.findall(r'<tr data-type="([^"]+)">', html) == ["a/b", "resize", "secret_report"]
        assert cells(row_of(html, "data-type", "secret_report"))[1] == "2"
        narrowed = (await api.client.get("/ui/types", params={"org": "globex"})).text
        assert re.findall(r'<tr data-type="([^"]+)">', narrowed) == ["secret_report"]
        assert 'href="/ui/types/secret_report?org=globex"' in narrowed
        assert 'href="/ui/jobs?type=secret_report&amp;org=globex&amp;status=failed"' in narrowed


async def test_the_new_pages_under_the_api_role(db_url: str, token_a: str, roles: Any) -> None:
    from psycopg.conninfo import make_conninfo

    seed_types(db_url)
    api_url = make_conninfo(db_url, user=roles.api)
    async with running_api(settings_for(api_url)) as api:
        await ui_login(api.client, token_a)
        page = await api.client.get("/ui/types")
        assert page.status_code == 200, page.text
        assert re.findall(r'<tr data-type="([^"]+)">', page.text) == ["a/b", "resize"]
        assert cells(row_of(page.text, "data-type", "resize"))[6] == "11"
        assert (await api.client.get("/ui/types/resize")).status_code == 200
        assert (await api.client.get("/ui/schedules")).status_code == 403
