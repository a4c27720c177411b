"""Flow control over HTTP: priority, concurrency key and dependencies on POST /jobs, a
full queue answered 429, bad dependencies answered 422 with nothing written."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from apikit import Api, bearer, db_scalar, running_api, settings_for

pytestmark = pytest.mark.anyio


async def submit(api: Api, token: str, **body: Any) -> httpx.Response:
    return await api.client.post("/jobs", json={"type": "t", **body}, headers=bearer(token))


def job_count(db_url: str) -> int:
    return int(db_scalar(db_url, "SELECT count(*) FROM jobsd.jobs"))


async def test_submit_with_priority_key_and_dependencies(db_url: str, token_a: str) -> None:
    async with running_api(settings_for(db_url)) as api:
        first = (await submit(api, token_a)).json()
        r = await submit(
            api, token_a, priority=-5, concurrency_key="site:42", depends_on=[first["id"]]
        )
        assert r.status_code == 202, r.text
        job = r.json()
        assert (job["priority"], job["concurrency_key"], job["status"]) == (
            -5,
            "site:42",
            "blocked",
        )
        listed = (await api.client.get("/jobs", headers=bearer(token_a))).json()["jobs"]
        assert {(j["id"], j["priority"], j["concurrency_key"]) for j in listed} == {
            (first["id"], 0, None),
            (job["id"], -5, "site:42"),
        }
    assert (
        db_scalar(
            db_url,
            "SELECT depends_on::text FROM jobsd.job_dependencies WHERE job_id = %s",
            job["id"],
        )
        == first["id"]
    )


async def test_a_full_queue_answers_429_and_writes_nothing(db_url: str, token_a: str) -> None:
    db_scalar(db_url, "INSERT INTO jobsd.queues (name, capacity) VALUES ('small', 1) RETURNING 1")
    async with running_api(settings_for(db_url)) as api:
        assert (await submit(api, token_a, queue="small")).status_code == 202
        r = await submit(api, token_a, queue="small", payload={"n": 2})
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "5"
        detail = r.json()["detail"]
        assert detail["code"] == "queue_full"
        assert "'small' is full (capacity 1)" in detail["message"]
    assert job_count(db_url) == 1


async def test_bad_dependencies_answer_422_and_write_nothing(
    db_url: str, token_a: str, token_b: str
) -> None:
    async with running_api(settings_for(db_url)) as api:
        other_org = (await submit(api, token_b)).json()
        ghost = str(uuid.uuid4())
        for depends_on, code in (
            ([ghost], "unknown_dependency"),
            ([other_org["id"]], "unknown_dependency"),
            (["not-a-uuid"], "uuid_parsing"),
        ):
            r = await submit(api, token_a, depends_on=depends_on)
            assert r.status_code == 422, r.text
            errors = r.json()["detail"]
            assert errors[0]["loc"][:2] == ["body", "depends_on"], errors
            assert errors[0]["type"] == code, errors
        own = str(uuid.uuid4())
        r = await submit(api, token_a, id=own, depends_on=[own])
        assert r.status_code == 422 and "itself" in r.text
        r = await submit(api, token_a, priority=10**9)
        assert r.status_code == 422 and "priority" in r.text
        r = await submit(api, token_a, concurrency_key="")
        assert r.status_code == 422 and "concurrency_key" in r.text
    assert job_count(db_url) == 1
