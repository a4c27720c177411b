"""What each front end decided on its own before every operation went through one door:
the dashboard's idea of authority, an org's view of other orgs' types, retries that
skipped admission or moved a terminal job, the submission rate a retry escaped.

Tokens are written straight into jobsd.api_tokens (an org's token, and an org's token
made ``--admin`` before such tokens became an operator's only), and every check is an
outcome: an answer's status, rows of jobsd.jobs and jobsd.queues.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from apikit import bearer, http_settings, running_api, settings_for, ui_login
from support.jobs import job_row, make_job
from support.tokens import stored_token

pytestmark = pytest.mark.anyio


def paused(db_url: str, queue: str) -> bool:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT paused_at FROM jobsd.queues WHERE name = %s", (queue,))
        found = row.fetchone()
    assert found is not None
    return found[0] is not None


def count(db_url: str, query: str, *args: Any) -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(query, args).fetchone()
    assert row is not None
    return int(row[0])


async def test_an_org_token_made_admin_is_an_org_token_in_the_dashboard_too(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        theirs = make_job(conn, org_id="globex", payload={"secret": "globex-only"})
    old_admin = stored_token(db_url, "acme", admin=True)
    async with running_api(settings_for(db_url)) as api:
        # the API: an org's token
        assert (await api.client.get("/queues", headers=bearer(old_admin))).status_code == 403
        csrf = await ui_login(api.client, old_admin)
        page = await api.client.get(f"/ui/jobs/{theirs}")
        assert page.status_code == 404 and "globex-only" not in page.text
        listed = await api.client.get("/ui/jobs", params={"org": "globex"})
        assert listed.status_code == 200 and str(theirs) not in listed.text
        pause = await api.client.post("/ui/queues/default/pause", data={"csrf": csrf})
        assert pause.status_code == 403
    assert not paused(db_url, "default")


async def test_an_org_overview_names_no_other_org_types(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for _ in range(3):
            make_job(conn, org_id="globex", type="globex_secret_report")
    acme = stored_token(db_url, "acme")
    operator = stored_token(db_url, None, admin=True)
    async with running_api(settings_for(db_url)) as api:
        await ui_login(api.client, acme)
        overview = await api.client.get("/ui")
        assert overview.status_code == 200
        assert "globex_secret_report" not in overview.text
        api.client.cookies.clear()
        await ui_login(api.client, operator)
        # an operator is told, as /health tells operators
        assert "globex_secret_report" in (await api.client.get("/ui")).text


async def test_a_retry_is_admitted_like_a_submission(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobsd.queues (name, capacity) VALUES ('small', 3)")
        failed = [make_job(conn, org_id="acme", queue="small", status="failed") for _ in range(6)]
    acme = bearer(stored_token(db_url, "acme"))
    async with running_api(settings_for(db_url)) as api:
        answers = [
            (await api.client.post(f"/jobs/{job_id}/retry", headers=acme)).status_code
            for job_id in failed
        ]
    assert answers == [202, 202, 202, 429, 429, 429]
    open_jobs = "SELECT count(*) FROM jobsd.jobs WHERE queue = 'small' AND status = 'queued'"
    assert count(db_url, open_jobs) == 3


async def test_a_retry_respects_the_org_quota_and_other_orgs_still_get_in(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobsd.queues (name, org_open_limit) VALUES ('fair', 2)")
        mine = [make_job(conn, org_id="acme", queue="fair", status="failed") for _ in range(4)]
        theirs = make_job(conn, org_id="globex", queue="fair", status="failed")
    acme, globex = bearer(stored_token(db_url, "acme")), bearer(stored_token(db_url, "globex"))
    async with running_api(settings_for(db_url)) as api:
        answers = [await api.client.post(f"/jobs/{job_id}/retry", headers=acme) for job_id in mine]
        other = await api.client.post(f"/jobs/{theirs}/retry", headers=globex)
    assert [a.status_code for a in answers] == [202, 202, 429, 429]
    assert answers[-1].json()["detail"]["code"] == "org_quota"
    assert other.status_code == 202
    acme_open = "SELECT count(*) FROM jobsd.jobs WHERE org_id = 'acme' AND status = 'queued'"
    assert count(db_url, acme_open) == 2


async def test_a_retry_counts_against_the_submission_rate(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        failed = [make_job(conn, org_id="acme", status="failed") for _ in range(3)]
    acme = bearer(stored_token(db_url, "acme"))
    http = http_settings(submit_rate="2/m")
    async with running_api(settings_for(db_url), http) as api:
        answers = [
            (await api.client.post(f"/jobs/{job_id}/retry", headers=acme)).status_code
            for job_id in failed
        ]
    assert answers == [202, 202, 429]


@pytest.mark.parametrize("status", ["failed", "cancelled"])
async def test_a_retried_job_stays_as_it_ended(db_url: str, status: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        job_id = make_job(conn, org_id="acme", status=status)
        before = job_row(conn, job_id)
    acme = bearer(stored_token(db_url, "acme"))
    async with running_api(settings_for(db_url)) as api:
        answer = await api.client.post(f"/jobs/{job_id}/retry", headers=acme)
        assert answer.status_code == 202, answer.text
        new_id = uuid.UUID(answer.json()["id"])
        old = (await api.client.get(f"/jobs/{job_id}", headers=acme)).json()
    assert new_id != job_id
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert job_row(conn, job_id) == before
    assert old["status"] == status and old["retried_as"] == str(new_id)
    assert old["history"][-1]["reason"] == f"retried as {new_id}"
