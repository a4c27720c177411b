"""``POST /jobs/{id}/retry`` and the unhandled jobs of ``/health``. A failed or cancelled
job of the caller's org is retried as a new job, the retried one left as it ended;
everything else is refused with a 409 or a 404, and nothing changes. ``/health`` counts
queued jobs whose type no live daemon handles, naming the 20 most queued types (the rest
under ``_other``)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from apikit import bearer, running_api, settings_for
from support.jobs import job_row, make_job, make_jobs

pytestmark = pytest.mark.anyio


async def test_retry_endpoint(db_url: str, token_a: str, token_b: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        failed = make_job(conn, org_id="acme", status="failed", claim={"attempts": 1})
        running = make_job(conn, org_id="acme", status="running")
        charge = make_job(conn, org_id="acme", status="cancelled", type="charge")
        conn.execute(
            "INSERT INTO jobsd.job_types (type, delivery, max_attempts) "
            "VALUES ('charge', 'at_most_once', 1)"
        )
        async with running_api(settings_for(db_url)) as api:

            async def retry(job: Any, token: str, **params: Any) -> Any:
                return await api.client.post(
                    f"/jobs/{job}/retry", params=params, headers=bearer(token)
                )

            # another org's job is not found, and is left alone
            r = await retry(failed, token_b)
            assert r.status_code == 404 and r.json()["detail"]["code"] == "job_not_found"
            assert job_row(conn, failed)["status"] == "failed"  # type: ignore[index]

            r = await retry(failed, token_a)
            assert r.status_code == 202, r.text
            new = r.json()
            assert (new["status"], new["attempts"], new["retry_of"]) == ("queued", 0, str(failed))
            assert r.headers["location"].endswith(f"/jobs/{new['id']}")
            last = conn.execute(
                "SELECT from_status, to_status, worker_id, reason FROM jobsd.all_job_events "
                "WHERE job_id = %s ORDER BY id DESC LIMIT 1",
                (failed,),
            ).fetchone()
            assert last == ("failed", "failed", "api", f"retried as {new['id']}")
            assert job_row(conn, failed)["status"] == "failed"  # type: ignore[index]
            again = await retry(failed, token_a)
            assert again.status_code == 202 and again.json()["id"] == new["id"]

            r = await retry(running, token_a)
            assert r.status_code == 409 and r.json()["detail"]["code"] == "job_not_ended"
            r = await retry(charge, token_a)
            assert r.status_code == 409 and r.json()["detail"]["code"] == "job_at_most_once"
            assert job_row(conn, charge)["status"] == "cancelled"  # type: ignore[index]
            r = await retry(charge, token_a, force="true")
            assert r.status_code == 202 and r.json()["status"] == "queued"
            r = await api.client.post(f"/jobs/{failed}/retry")
            assert r.status_code == 401


async def test_health_counts_queued_jobs_no_live_daemon_handles(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        make_job(conn, type="gamma")
        make_job(conn, type="alpha")
        make_job(conn, type="alpha", status="running")
        conn.execute(
            "INSERT INTO jobsd.workers (worker_id, hostname, pid, types) "
            "VALUES ('w1', 'h', 1, '{alpha}')"
        )
        async with running_api(settings_for(db_url)) as api:
            report = (await api.client.get("/health")).json()
            assert (report["unhandled_jobs"], report["unhandled_types"]) == (1, {"gamma": 1})
            assert any("gamma (1)" in w for w in report["warnings"]), report["warnings"]
            # a daemon that takes every type (JOBSD_UNKNOWN_TYPES=fail) handles them all
            conn.execute("UPDATE jobsd.workers SET types = NULL")
            report = (await api.client.get("/health")).json()
            assert (report["unhandled_jobs"], report["unhandled_types"]) == (0, {})


async def test_health_names_the_most_queued_unhandled_types(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for i in range(25):  # type_00: 25 jobs ... type_24: 1
            make_jobs(conn, 25 - i, type=f"type_{i:02d}")
        async with running_api(settings_for(db_url)) as api:
            report = (await api.client.get("/health")).json()
    named = {f"type_{i:02d}": 25 - i for i in range(20)}
    assert report["unhandled_types"] == {**named, "_other": 5 + 4 + 3 + 2 + 1}
    assert report["unhandled_jobs"] == sum(range(1, 26))
    assert list(report["unhandled_types"])[:2] == ["type_00", "type_01"]  # the most first
    warning = next(w for w in report["warnings"] if "no live daemon handles" in w)
    assert "type_00 (25), type_01 (24)" in warning, warning
    assert "type_19 (6) and 5 other types (15 jobs);" in warning, warning
    assert "type_20" not in warning
