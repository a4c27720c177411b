"""A running job's silence (time since its handler's last progress) is shown as it is:
the daemon's own liveness never refreshes it. GET /jobs/{id}, /health and /metrics."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import anyio
import pytest
from apikit import bearer, running_api, running_daemon, settings_for, wait_until
from prometheus_client.parser import text_string_to_metric_families

import jobsd
from jobsd.registry import Registry

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def longest_silence(metrics_text: str) -> float | None:
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "jobsd_running_longest_silence_seconds":
                return float(sample.value)
    return None


async def test_a_hung_handler_is_shown_silent_while_its_daemon_lives(
    db_url: str, token_a: str
) -> None:
    speak = anyio.Event()
    done = anyio.Event()
    registry = Registry()

    @jobsd.handler("hang", registry=registry)
    async def hang(ctx: jobsd.JobContext) -> None:
        await speak.wait()  # silent: no progress
        ctx.progress(done=1)
        await done.wait()

    # the daemon checks its jobs every 0.1 s: none of that is the handler's progress
    settings = settings_for(db_url, heartbeat_interval=0.1)
    async with (
        running_daemon(settings, registry) as daemon,
        running_api(settings, daemon=daemon) as api,
    ):
        await api.until_listening()
        posted = await api.client.post("/jobs", json={"type": "hang"}, headers=bearer(token_a))
        url = f"/jobs/{posted.json()['id']}"

        async def silent_for(at_least_s: float) -> dict[str, Any] | None:
            job = (await api.client.get(url, headers=bearer(token_a))).json()
            silence = job.get("silence_s")
            return job if silence is not None and silence >= at_least_s else None

        job = await wait_until(lambda: silent_for(1.5), what="1.5 s of silence", timeout_s=15)
        assert job["status"] == "running"
        assert job["last_progress_at"] == job["started_at"]
        health = (await api.client.get("/health")).json()
        assert health["oldest_running_idle_s"] >= 1.5
        silence = longest_silence((await api.client.get("/metrics")).text)
        assert silence is not None and silence >= 1.5

        speak.set()

        async def spoke() -> dict[str, Any] | None:
            job = (await api.client.get(url, headers=bearer(token_a))).json()
            return job if job["last_progress_at"] != job["started_at"] else None

        job = await wait_until(spoke, what="the handler's progress")
        last = datetime.fromisoformat(job["last_progress_at"])
        assert last > datetime.fromisoformat(job["started_at"])
        assert job["silence_s"] < 1.5
        done.set()
        finished = (await api.client.get(f"{url}?wait=10", headers=bearer(token_a))).json()
    assert finished["status"] == "succeeded"
    assert (finished["silence_s"], finished["last_progress_at"]) == (None, None)
