"""``POST /jobs/retry``, ``/jobs/cancel``, ``/jobs/resolve``: every job of a filter in one
call, within the token's org, counted against the submission rate, and bad input refused
with a 422 that names the field."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from apikit import bearer, http_settings, running_api, settings_for
from fastapi import FastAPI
from support.jobs import make_job, make_jobs

import jobsd.http

pytestmark = pytest.mark.anyio

CLAIM = {"attempts": 1, "worker_id": "w1"}


def statuses(conn: psycopg.Connection[Any], ids: list[Any]) -> list[str]:
    rows = dict(conn.execute("SELECT id, status FROM jobsd.jobs WHERE id = ANY(%s)", (ids,)))
    return [rows[i] for i in ids]


async def test_an_orgs_token_acts_on_its_own_jobs_only(
    db_url: str, token_a: str, token_b: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        mine = make_jobs(conn, 3, status="failed", org_id="acme", claim=CLAIM)
        theirs = make_jobs(conn, 2, status="failed", org_id="globex", claim=CLAIM)
        async with running_api(settings_for(db_url)) as api:

            async def post(path: str, token: str, **body: Any) -> Any:
                return await api.client.post(path, json=body, headers=bearer(token))

            dry = await post("/jobs/retry", token_a, dry_run=True)
            assert dry.status_code == 200, dry.text
            assert dry.json() == {
                "id": None,
                "action": "retry",
                "dry_run": True,
                "limit": 1000,
                "matched": 3,
                "done": 0,
                "requested": 0,
                "refused": {},
                "remaining": 3,
            }
            # naming another org matches nothing for an org's token
            other = await post("/jobs/retry", token_a, org_id="globex")
            assert other.status_code == 200 and other.json()["matched"] == 0
            done = await post("/jobs/retry", token_a)
            assert done.status_code == 200, done.text
            out = done.json()
            assert (out["done"], out["remaining"], out["limit"]) == (3, 0, 1000)
            made = conn.execute(
                "SELECT retry_of FROM jobsd.jobs WHERE retry_of IS NOT NULL"
            ).fetchall()
            assert {r[0] for r in made} == set(mine)
            note = conn.execute(
                "SELECT worker_id "
                "FROM jobsd.all_job_events WHERE job_id = %s ORDER BY id DESC LIMIT 1",
                (mine[0],),
            ).fetchone()
            assert note == (f"api (bulk {out['id']})",)
            assert (await post("/jobs/retry", token_a)).json()["matched"] == 0

            running = make_job(conn, status="running", org_id="acme", claim=CLAIM)
            cancelled = await post("/jobs/cancel", token_a, status="running")
            assert cancelled.status_code == 200, cancelled.text
            assert (cancelled.json()["done"], cancelled.json()["requested"]) == (1, 1)
            assert conn.execute(
                "SELECT cancel_requested_at IS NOT NULL FROM jobsd.jobs WHERE id = %s", (running,)
            ).fetchone() == (True,)

            stuck = make_job(conn, status="recovery_required", org_id="globex", claim=CLAIM)
            assert (await post("/jobs/resolve", token_a, outcome="failed")).json()["matched"] == 0
            settled = await post("/jobs/resolve", token_b, outcome="requeue")
            assert settled.status_code == 200 and settled.json()["done"] == 1
            assert statuses(conn, [stuck, *theirs]) == ["queued", "failed", "failed"]

            # the routes beside them are the same as before
            submitted = await post("/jobs", token_a, type="t")
            assert submitted.status_code == 202, submitted.text
            single = await api.client.post(f"/jobs/{theirs[0]}/retry", headers=bearer(token_b))
            assert single.status_code == 202, single.text
            assert (await api.client.post("/jobs/retry", json={})).status_code == 401


@pytest.mark.parametrize(
    ("path", "body", "where", "fragment"),
    [
        ("/jobs/retry", {"limit": 0}, ["body", "limit"], "greater than or equal to 1"),
        ("/jobs/cancel", {"limit": 10001}, ["body", "limit"], "less than or equal to 10000"),
        ("/jobs/retry", {"status": "queued"}, ["body", "status"], "'failed' or 'cancelled'"),
        ("/jobs/cancel", {"status": "failed"}, ["body", "status"], "'queued'"),
        (
            "/jobs/retry",
            {"since": "2030-01-02T00:00:00Z", "until": "2030-01-01T00:00:00Z"},
            ["body"],
            "until must be after since",
        ),
        ("/jobs/retry", {"since": "2030-01-02T00:00:00"}, ["body", "since"], "timezone"),
        ("/jobs/cancel", {"queue": "nope"}, ["body", "queue"], "unknown queue 'nope'"),
        ("/jobs/resolve", {}, ["body", "outcome"], "Field required"),
        ("/jobs/retry", {"typo": 1}, ["body", "typo"], "Extra inputs"),
    ],
)
async def test_bad_input_is_a_422_naming_the_field_and_nothing_changes(
    db_url: str, token_a: str, path: str, body: dict[str, Any], where: list[str], fragment: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        make_job(conn, status="failed", org_id="acme", claim=CLAIM)
        queued = make_job(conn, org_id="acme")
        async with running_api(settings_for(db_url)) as api:
            r = await api.client.post(path, json=body, headers=bearer(token_a))
        assert r.status_code == 422, r.text
        error = r.json()["detail"][0]
        assert error["loc"] == where and fragment in error["msg"], error
        assert conn.execute("SELECT count(*) FROM jobsd.bulk_actions").fetchone() == (0,)
        assert statuses(conn, [queued]) == ["queued"]


async def test_a_bulk_retry_counts_one_submission_per_job(db_url: str, token_a: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        make_jobs(conn, 8, status="failed", org_id="acme", claim=CLAIM)
        async with running_api(settings_for(db_url), http_settings(submit_rate="5/m")) as api:
            # a dry run submits nothing
            dry = await api.client.post(
                "/jobs/retry", json={"dry_run": True}, headers=bearer(token_a)
            )
            assert dry.json()["matched"] == 8
            first = await api.client.post("/jobs/retry", json={}, headers=bearer(token_a))
            assert first.status_code == 200, first.text
            out = first.json()
            assert (out["limit"], out["done"], out["remaining"]) == (5, 5, 3)
            # the bucket is empty: 429, nothing done, and the single retry is held too
            second = await api.client.post("/jobs/retry", json={}, headers=bearer(token_a))
            assert second.status_code == 429, second.text
            assert second.json()["detail"]["code"] == "rate_limited"
            assert int(second.headers["retry-after"]) >= 1
            assert conn.execute(
                "SELECT count(*) FROM jobsd.jobs WHERE retry_of IS NOT NULL"
            ).fetchone() == (5,)
            # a cancel submits nothing: not held
            cancel = await api.client.post("/jobs/cancel", json={}, headers=bearer(token_a))
            assert cancel.status_code == 200 and cancel.json()["done"] == 5


def test_a_host_apps_router_has_the_bulk_endpoints() -> None:
    app = FastAPI()
    app.include_router(jobsd.http.router(org_dependency=lambda: "acme"), prefix="/api")
    paths = app.openapi()["paths"]
    for action in ("retry", "cancel", "resolve"):
        assert "post" in paths[f"/api/jobs/{action}"]
