"""GET /schedules and the schedule counters of /metrics, in-process on a real Postgres."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest
from apikit import bearer, running_api, settings_for

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
        token, _ = create_token(conn, OPERATOR, None, "ops", admin=True)
    return token


async def test_admins_list_the_schedules_and_metrics_count_their_ticks(
    db_url: str, token_a: str
) -> None:
    admin = admin_token(db_url)
    beat = Schedule.build(id="beat", type="beat", org_id="acme", every="60s")
    full = Schedule.build(id="full", type="t", org_id="acme", every="60s", queue="tiny")
    clock = ManualClock(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    async with running_api(settings_for(db_url)) as api:
        async with api.backend.pool.connection() as conn:
            await create_queue(conn, "tiny", capacity=1)
        scheduler = Scheduler(
            api.backend.pool, SchedulerSettings(worker_id="w"), clock, [beat, full]
        )
        await scheduler.run_once()
        for _ in range(2):  # 12:01, 12:02: beat fires twice, full once then refused
            clock.advance(60)
            await scheduler.run_once()

        r = await api.client.get("/schedules", headers=bearer(admin))
        assert r.status_code == 200, r.text
        listed = {s["id"]: s for s in r.json()["schedules"]}
        assert list(listed) == ["beat", "full"]
        assert listed["beat"]["last_tick"] == "2026-06-01T12:02:00Z"
        assert listed["beat"]["last_state"] == "queued" and listed["beat"]["last_job_id"]
        assert (listed["beat"]["fired"], listed["beat"]["refused"]) == (2, 0)
        assert listed["beat"]["spec"] == "every 1m" and listed["beat"]["every_s"] == 60
        assert listed["full"]["last_state"] == "refused"
        assert listed["full"]["last_job_id"] is None
        assert "is full" in listed["full"]["last_reason"]
        assert (listed["full"]["fired"], listed["full"]["refused"]) == (1, 1)

        r = await api.client.get("/schedules", headers=bearer(token_a))
        assert r.status_code == 403 and r.json()["detail"]["code"] == "admin_required"
        assert (await api.client.get("/schedules")).status_code == 401

        text = (await api.client.get("/metrics")).text
        for line in (
            'jobsd_schedule_ticks_total{outcome="fired",schedule="beat"} 2.0',
            'jobsd_schedule_ticks_total{outcome="fired",schedule="full"} 1.0',
            'jobsd_schedule_ticks_total{outcome="refused",schedule="full"} 1.0',
            'jobsd_schedule_ticks_total{outcome="late",schedule="beat"} 0.0',
            'jobsd_schedule_ticks_total{outcome="skipped",schedule="full"} 0.0',
        ):
            assert line in text, line
