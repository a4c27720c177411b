"""The API attached to a running daemon: ST-3, CA-4, readiness, health and /metrics moving."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from apikit import bearer, http_settings, running_api, running_daemon, settings_for, wait_until
from prometheus_client.parser import text_string_to_metric_families

import jobsd
from jobsd.http.protocols import DaemonView
from jobsd.registry import Registry

pytestmark = pytest.mark.anyio


def make_registry() -> Registry:
    reg = Registry()

    @jobsd.handler("ok", registry=reg)
    async def ok(ctx: jobsd.JobContext) -> dict[str, Any]:
        return {"echo": ctx.payload}

    @jobsd.handler("boom", registry=reg)
    async def boom(ctx: jobsd.JobContext) -> None:
        raise ValueError("boom: bad row 7")

    return reg


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Map (sample name, sorted labels) to value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_failed_and_succeeded_jobs_stay_readable_with_cause_and_history(
    db_url: str, token_a: str
) -> None:
    """ST-3: a failed job shows its cause. CA-4: a finished job stays readable."""
    settings = settings_for(db_url)
    async with (
        running_daemon(settings, make_registry()) as daemon,
        running_api(settings, daemon=daemon) as api,
    ):
        await api.until_listening()
        bad = (
            await api.client.post("/jobs", json={"type": "boom"}, headers=bearer(token_a))
        ).json()
        good = (
            await api.client.post(
                "/jobs", json={"type": "ok", "payload": {"a": 1}}, headers=bearer(token_a)
            )
        ).json()
        r = await api.client.get(f"/jobs/{bad['id']}?wait=10", headers=bearer(token_a))
        failed = r.json()
        assert failed["status"] == "failed"
        assert "boom: bad row 7" in failed["error"]
        assert failed["report"]["error"]["type"].endswith("ValueError")
        assert [(h["from"], h["to"]) for h in failed["history"]] == [
            (None, "queued"),
            ("queued", "running"),
            ("running", "failed"),
        ]
        assert failed["history"][1]["worker"] == settings.worker_id
        r = await api.client.get(f"/jobs/{good['id']}?wait=10", headers=bearer(token_a))
        assert r.json()["status"] == "succeeded"
        assert r.json()["report"] == {"echo": {"a": 1}}
    # CA-4: still readable afterwards, by a fresh API with no daemon
    async with running_api(settings_for(db_url)) as api:
        for job in (bad, good):
            r = await api.client.get(f"/jobs/{job['id']}", headers=bearer(token_a))
            assert r.status_code == 200
            assert r.json()["finished_at"] is not None


async def test_metrics_counters_move_when_jobs_run(db_url: str, token_a: str) -> None:
    settings = settings_for(db_url, slots=3)
    async with (
        running_daemon(settings, make_registry()) as daemon,
        running_api(settings, daemon=daemon) as api,
    ):
        await api.until_listening()
        before = samples((await api.client.get("/metrics")).text)
        assert before[("jobsd_slots", ())] == 3
        assert before[("jobsd_listen_connected", ())] == 1
        assert ("jobsd_jobs_claimed_total", (("type", "ok"),)) not in before
        ids = []
        for i in range(3):
            r = await api.client.post(
                "/jobs", json={"type": "ok", "payload": {"i": i}}, headers=bearer(token_a)
            )
            ids.append(r.json()["id"])
        r = await api.client.post("/jobs", json={"type": "boom"}, headers=bearer(token_a))
        ids.append(r.json()["id"])
        for job_id in ids:
            r = await api.client.get(f"/jobs/{job_id}?wait=10", headers=bearer(token_a))
            assert r.json()["status"] in ("succeeded", "failed")

        async def finished_written() -> dict[Any, float] | None:
            now = samples((await api.client.get("/metrics")).text)
            key = ("jobsd_jobs_finished_total", (("status", "failed"), ("type", "boom")))
            return now if now.get(key) == 1 else None

        after = await wait_until(finished_written, what="the failed outcome in /metrics")
    assert after[("jobsd_jobs_claimed_total", (("type", "ok"),))] == 3
    assert after[("jobsd_jobs_claimed_total", (("type", "boom"),))] == 1
    assert after[("jobsd_jobs_finished_total", (("status", "succeeded"), ("type", "ok")))] == 3
    assert after[("jobsd_queue_depth", (("queue", "default"), ("status", "queued")))] == 0
    assert after[("jobsd_database_up", ())] == 1
    wakeups = {k[1][0][1]: v for k, v in after.items() if k[0] == "jobsd_wakeups_total"}
    assert wakeups.get("start") == 1
    assert wakeups.get("notify", 0) >= 1
    assert after[("jobsd_api_done_notifications_total", ())] >= 4
    run_count = ("jobsd_job_run_seconds_count", (("type", "ok"),))
    if any(name == "jobsd_job_run_seconds_count" for name, _ in after):  # needs stats.run_s
        assert after[run_count] == 3
    assert (
        after[
            (
                "jobsd_http_requests_total",
                (("method", "POST"), ("route", "/jobs"), ("status", "202")),
            )
        ]
        == 4
    )


async def test_queue_depth_counts_queued_scheduled_running(db_url: str, token_a: str) -> None:
    async with running_api(settings_for(db_url)) as api:
        for _ in range(2):
            await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token_a))
        await api.client.post(
            "/jobs",
            json={"type": "t", "run_after": "2031-01-01T00:00:00Z"},
            headers=bearer(token_a),
        )
        now = samples((await api.client.get("/metrics")).text)
    depth = {
        dict(labels)["status"]: v
        for (name, labels), v in now.items()
        if name == "jobsd_queue_depth"
    }
    assert depth == {"queued": 2, "scheduled": 1, "running": 0, "recovery_required": 0}
    # no daemon attached: no daemon series
    assert not any(name.startswith("jobsd_jobs_claimed") for name, _ in now)


async def test_readiness_includes_the_daemon_listen_connection(db_url: str) -> None:
    settings = settings_for(db_url)
    async with running_daemon(settings, make_registry()) as daemon:
        view: DaemonView = daemon  # the supervisor's Daemon is what the API reads
        async with running_api(settings, daemon=view) as api:
            await api.until_listening()
            r = await api.client.get("/readyz")
            assert r.status_code == 200
            assert r.json() == {
                "status": "ready",
                "checks": {
                    "database": True,
                    "listen": True,
                    "daemon_listen": True,
                    "daemon_progress": True,
                },
            }
            # issue 12: outcomes waiting unwritten past JOBSD_OUTCOME_STALL_AFTER: not ready
            daemon.completer.stalled = lambda bound_s: True  # type: ignore[method-assign]
            r = await api.client.get("/readyz")
            assert r.status_code == 503 and r.json()["checks"]["daemon_progress"] is False
            assert not await daemon.healthy()
            del daemon.completer.stalled
            health = (await api.client.get("/health")).json()
            assert health["slots"] == settings.slots
            assert health["slots_busy"] == 0
            r = await api.client.get("/healthz")
            assert r.status_code == 200 and r.json()["status"] == "ok"


async def test_health_report_warns_before_the_table_gets_sick(db_url: str, token_a: str) -> None:
    http = http_settings(
        health_pickup_lag_warn=60, health_xact_age_warn=0.05, health_dead_tuples_warn=0
    )
    async with running_api(settings_for(db_url), http) as api:
        await api.until_listening()
        report = (await api.client.get("/health")).json()
        assert report["status"] == "ok", report
        assert report["oldest_queued_age_s"] is None
        job_id = (
            await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token_a))
        ).json()["id"]
        with psycopg.connect(db_url, autocommit=True) as conn:
            # a job that has waited two hours, and dead tuples from updating it
            conn.execute(
                "UPDATE jobsd.jobs SET created_at = now() - interval '2 hours', "
                "run_after = now() - interval '2 hours' WHERE id = %s",
                (job_id,),
            )
            conn.execute("SELECT pg_stat_force_next_flush()")
            with psycopg.connect(db_url) as idle:  # a transaction left open
                idle.execute("SELECT txid_current()")
                await wait_until(
                    lambda: _report_with(api, "oldest_xact_age_s", 0.05),
                    what="the open transaction to be seen",
                )
                report = (await api.client.get("/health")).json()
    assert report["status"] == "warn"
    assert report["oldest_queued_age_s"] >= 7199
    text = " ".join(report["warnings"])
    assert "pickup lag" in text
    assert "holds back vacuum" in text
    assert report["dead_tuples"] is not None


async def _report_with(api: Any, field: str, above: float) -> bool:
    value = (await api.client.get("/health")).json()[field]
    return value is not None and value > above


async def test_health_and_metrics_show_the_notify_queue_a_stuck_listener_fills(
    db_url: str,
) -> None:
    """A session that LISTENs and then sits in a transaction holds the NOTIFY queue; when
    it is full every enqueue that notifies fails. It shows before that (fault campaign T20)."""
    http = http_settings(health_notify_queue_warn=0.0)
    async with running_api(settings_for(db_url), http) as api:
        await api.until_listening()
        quiet = (await api.client.get("/health")).json()
        assert quiet["notify_queue_usage"] == 0.0
        with psycopg.connect(db_url) as stuck, psycopg.connect(db_url, autocommit=True) as conn:
            stuck.execute("LISTEN jobsd")
            stuck.commit()
            stuck.execute("SELECT 1")  # a transaction left open: it reads nothing more
            # distinct payloads, so none are folded: a few pages of the queue
            conn.execute("SELECT pg_notify('jobsd', 'q' || g) FROM generate_series(1, 2000) g")
            report = (await api.client.get("/health")).json()
            metrics = (await api.client.get("/metrics")).text
    assert report["notify_queue_usage"] > 0
    assert report["status"] == "warn"
    assert "NOTIFY queue" in " ".join(report["warnings"])
    usage = [line for line in metrics.splitlines() if line.startswith("jobsd_notification_queue")]
    assert usage and float(usage[0].split()[-1]) > 0
