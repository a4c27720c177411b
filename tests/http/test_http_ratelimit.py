"""Submissions and reads per token over their rate: 429 with Retry-After, nothing written;
requests past JOBSD_HTTP_MAX_CONCURRENCY: tests/http/test_http_lockout.py.

The token bucket itself is tested in tests/unit/test_ratelimit.py."""

from __future__ import annotations

import pytest
from apikit import (
    bearer,
    db_scalar,
    http_settings,
    make_token,
    running_api,
    settings_for,
)
from support.clock import FakeClock


@pytest.mark.anyio
async def test_over_the_rate_post_jobs_answers_429_and_inserts_nothing(
    db_url: str, token_a: str, token_b: str
) -> None:
    second_a = make_token(db_url, "acme", "second")
    async with running_api(settings_for(db_url), http_settings(submit_rate="2/m")) as api:
        limiter = api.backend.submit_limiter
        assert limiter is not None
        clock = FakeClock()
        limiter.clock = clock
        for _ in range(2):
            r = await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token_a))
            assert r.status_code == 202, r.text

        r = await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token_a))
        assert r.status_code == 429, r.text
        assert r.headers["Retry-After"] == "30"
        detail = r.json()["detail"]
        assert detail["code"] == "rate_limited" and detail["retry_after_s"] == 30
        assert "2/m" in detail["message"]
        assert db_scalar(db_url, "SELECT count(*) FROM jobsd.jobs") == 2

        # per token: another token of the same org, and another org, are not held back
        r = await api.client.post("/jobs", json={"type": "t"}, headers=bearer(second_a))
        assert r.status_code == 202, r.text
        r = await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token_b))
        assert r.status_code == 202, r.text
        # reads have their own bucket (JOBSD_READ_RATE); a bad token is still 401, not 429
        assert (await api.client.get("/jobs", headers=bearer(token_a))).status_code == 200
        bad = bearer("jobsd_" + "x" * 43)
        assert (await api.client.post("/jobs", json={"type": "t"}, headers=bad)).status_code == 401

        clock.now += 30
        r = await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token_a))
        assert r.status_code == 202, r.text
    assert db_scalar(db_url, "SELECT count(*) FROM jobsd.jobs") == 5


@pytest.mark.anyio
async def test_over_the_read_rate_get_jobs_and_get_job_answer_429(
    db_url: str, token_a: str, token_b: str
) -> None:
    async with running_api(settings_for(db_url), http_settings(read_rate="3/m")) as api:
        limiter = api.backend.read_limiter
        assert limiter is not None
        clock = FakeClock()
        limiter.clock = clock
        r = await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token_a))
        assert r.status_code == 202, r.text  # submissions do not take from the read bucket
        job_id = r.json()["id"]
        # GET /jobs and GET /jobs/{id} share one bucket per token
        assert (await api.client.get("/jobs", headers=bearer(token_a))).status_code == 200
        assert (await api.client.get(f"/jobs/{job_id}", headers=bearer(token_a))).status_code == 200
        assert (await api.client.get("/jobs", headers=bearer(token_a))).status_code == 200

        for path in ("/jobs", f"/jobs/{job_id}"):
            r = await api.client.get(path, headers=bearer(token_a))
            assert r.status_code == 429, (path, r.text)
            assert r.headers["Retry-After"] == "20"
            detail = r.json()["detail"]
            assert detail["code"] == "rate_limited" and "3/m" in detail["message"]

        # per token: another org's token still reads; a refused read took nothing
        assert (await api.client.get("/jobs", headers=bearer(token_b))).status_code == 200
        clock.now += 20
        r = await api.client.get(f"/jobs/{job_id}", headers=bearer(token_a))
        assert r.status_code == 200 and r.json()["id"] == job_id, r.text
        assert (await api.client.get("/jobs", headers=bearer(token_a))).status_code == 429
