"""/health reports liveness per job (issue 11): the oldest running job and the
recovery_required backlog, every org's."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from apikit import running_api, settings_for
from support.jobs import make_job

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_health_reports_the_oldest_running_job_and_the_recovery_backlog(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running_api(settings_for(db_url)) as api:
        await api.until_listening()
        quiet = (await api.client.get("/health")).json()
        make_job(conn, status="running", org_id="acme")
        old = make_job(conn, status="running", org_id="other")
        conn.execute(
            "UPDATE jobsd.jobs SET started_at = now() - interval '90 seconds', "
            "progress = jsonb_build_object('updated_at', now() - interval '80 seconds') "
            "WHERE id = %s",
            (old,),
        )
        for _ in range(2):
            make_job(conn, status="recovery_required", org_id="acme")
        report = (await api.client.get("/health")).json()

    assert (quiet["oldest_running_age_s"], quiet["recovery_required"]) == (None, 0)
    assert 89 <= report["oldest_running_age_s"] < 120
    assert 79 <= report["oldest_running_idle_s"] < 110
    assert report["recovery_required"] == 2
    assert report["status"] == "warn"
    assert any("2 job(s) are recovery_required" in w for w in report["warnings"])
