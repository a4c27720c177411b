"""The jobs endpoints in-process (httpx ASGI transport) against a real Postgres.

Seed 002 ST-1 (submit with no worker), the org wall, idempotent submission, keyset
listing, cancel, tokens, and every error code of the submit endpoint.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import httpx
import psycopg
import pytest
from apikit import Api, bearer, db_scalar, make_token, running_api, settings_for

from jobsd.ids import uuid7
from jobsd.ops import Caller
from jobsd.ops.tokens import revoke_token

OPERATOR = Caller.as_operator("tests")

pytestmark = pytest.mark.anyio


async def submit(api: Api, token: str, **body: Any) -> httpx.Response:
    return await api.client.post("/jobs", json={"type": "t", **body}, headers=bearer(token))


def job_count(db_url: str) -> int:
    return int(db_scalar(db_url, "SELECT count(*) FROM jobsd.jobs"))


async def test_submit_without_workers_answers_202_queued_and_history(
    db_url: str, token_a: str
) -> None:
    """ST-1: no daemon runs; the job is committed, queued, and readable with its history."""
    async with running_api(settings_for(db_url)) as api:
        r = await submit(api, token_a, payload={"file": "a.csv"}, dedup_key="k1")
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["status"] == "queued"
        assert job["org_id"] == "acme"
        assert job["payload"] == {"file": "a.csv"}
        assert r.headers["location"].endswith(f"/jobs/{job['id']}")
        # committed: another connection sees it
        assert db_scalar(db_url, "SELECT status FROM jobsd.jobs WHERE id = %s", job["id"]) == (
            "queued"
        )
        r = await api.client.get(f"/jobs/{job['id']}", headers=bearer(token_a))
        assert r.status_code == 200
        detail = r.json()
        for key in ("id", "type", "queue", "status", "attempts", "progress", "report", "error"):
            assert key in detail
        for key in ("created_at", "started_at", "finished_at", "history"):
            assert key in detail
        assert detail["history"] == [
            {
                "from": None,
                "to": "queued",
                "at": detail["history"][0]["at"],
                "attempt": 0,
                "reason": None,
                "worker": None,
            }
        ]


async def test_get_and_list_show_a_reservation_only_while_the_job_is_queued(
    db_url: str, token_a: str
) -> None:
    async with running_api(settings_for(db_url)) as api:
        job_id = (await submit(api, token_a)).json()["id"]
        r = await api.client.get(f"/jobs/{job_id}", headers=bearer(token_a))
        assert r.json()["reserved_until"] is None
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE jobsd.jobs SET worker_id = 'w', lease_id = gen_random_uuid(), "
                "reserved_until = now() + interval '2 seconds' WHERE id = %s",
                (job_id,),
            )
        got = (await api.client.get(f"/jobs/{job_id}", headers=bearer(token_a))).json()
        assert (got["status"], got["attempts"]) == ("queued", 0)
        assert got["reserved_until"] is not None
        listed = (await api.client.get("/jobs", headers=bearer(token_a))).json()
        assert [j["reserved_until"] is not None for j in listed["jobs"]] == [True]
        assert (
            await api.client.post(f"/jobs/{job_id}/cancel", headers=bearer(token_a))
        ).status_code == 200
        got = (await api.client.get(f"/jobs/{job_id}", headers=bearer(token_a))).json()
        assert (got["status"], got["reserved_until"]) == ("cancelled", None)


async def test_run_after_in_the_future_is_scheduled(db_url: str, token_a: str) -> None:
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    async with running_api(settings_for(db_url)) as api:
        r = await submit(api, token_a, run_after=later)
        assert r.status_code == 202, r.text
        assert r.json()["status"] == "scheduled"


async def test_org_wall_on_read_list_and_cancel(db_url: str, token_a: str, token_b: str) -> None:
    """A job of another org is 404 exactly like a missing one, and absent from lists."""
    async with running_api(settings_for(db_url)) as api:
        mine = (await submit(api, token_a)).json()["id"]
        missing = str(uuid7())
        other = await api.client.get(f"/jobs/{mine}", headers=bearer(token_b))
        absent = await api.client.get(f"/jobs/{missing}", headers=bearer(token_b))
        assert other.status_code == absent.status_code == 404
        assert other.json()["detail"]["code"] == absent.json()["detail"]["code"] == "job_not_found"
        assert other.json()["detail"]["message"] == f"job {mine} not found"
        r = await api.client.get(f"/jobs/{mine}?wait=0.1", headers=bearer(token_b))
        assert r.status_code == 404
        r = await api.client.get("/jobs", headers=bearer(token_b))
        assert r.json() == {"jobs": [], "next_cursor": None}
        r = await api.client.post(f"/jobs/{mine}/cancel", headers=bearer(token_b))
        assert r.status_code == 404
        assert db_scalar(db_url, "SELECT status FROM jobsd.jobs WHERE id = %s", mine) == "queued"
        r = await api.client.get("/jobs", headers=bearer(token_a))
        assert [j["id"] for j in r.json()["jobs"]] == [mine]


async def test_concurrent_duplicate_posts_with_a_client_id_make_one_job(
    db_url: str, token_a: str
) -> None:
    job_id = str(uuid7())
    answers: list[httpx.Response] = []
    async with running_api(settings_for(db_url, pool_size=10)) as api:

        async def post() -> None:
            answers.append(await submit(api, token_a, id=job_id, payload={"n": 1}))

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(post)
        assert [r.status_code for r in answers] == [202] * 20
        assert {r.json()["id"] for r in answers} == {job_id}
        # a later retry (say after "outcome unknown") still returns the same job
        again = await submit(api, token_a, id=job_id, payload={"n": 1})
        assert again.status_code == 202 and again.json()["id"] == job_id
    assert job_count(db_url) == 1
    assert db_scalar(db_url, "SELECT count(*) FROM jobsd.all_job_events") == 1


async def test_a_client_id_of_another_org_is_refused(
    db_url: str, token_a: str, token_b: str
) -> None:
    job_id = str(uuid7())
    async with running_api(settings_for(db_url)) as api:
        assert (await submit(api, token_a, id=job_id)).status_code == 202
        r = await submit(api, token_b, id=job_id)
        assert r.status_code == 409
        assert r.json()["detail"]["code"] == "id_in_use"
    assert job_count(db_url) == 1


async def test_dedup_key_returns_the_pending_job(db_url: str, token_a: str, token_b: str) -> None:
    async with running_api(settings_for(db_url)) as api:
        first = (await submit(api, token_a, dedup_key="site:1")).json()
        second = (await submit(api, token_a, dedup_key="site:1", payload={"x": 2})).json()
        other_org = (await submit(api, token_b, dedup_key="site:1")).json()
        assert second["id"] == first["id"]
        assert other_org["id"] != first["id"]


@pytest.mark.parametrize(
    ("body", "status", "where"),
    [
        ({"type": "t", "queue": "nope"}, 422, ["body", "queue"]),
        ({"type": "t", "queue": "bad queue!"}, 422, ["body", "queue"]),
        ({"type": ""}, 422, ["body", "type"]),
        ({"payload": {}}, 422, ["body", "type"]),
        ({"type": "t", "payload": [1, 2]}, 422, ["body", "payload"]),
        ({"type": "t", "payload": {"a": "\x00"}}, 422, ["body", "payload"]),
        ({"type": "t\x00"}, 422, ["body", "type"]),
        ({"type": "t", "dedup_key": "k" * 513}, 422, ["body", "dedup_key"]),
        ({"type": "t", "run_after": "2030-01-01T00:00:00"}, 422, ["body", "run_after"]),
        ({"type": "t", "run_after": "0001-01-01T00:00:00+01:00"}, 422, ["body", "run_after"]),
        ({"type": "t", "id": "not-a-uuid"}, 422, ["body", "id"]),
        ({"type": "t", "colour": 1}, 422, ["body", "colour"]),  # unknown fields
        ({"type": "t", "priority": 1.5}, 422, ["body", "priority"]),
    ],
)
async def test_submit_refuses_bad_bodies_with_422(
    db_url: str, token_a: str, body: dict[str, Any], status: int, where: list[str]
) -> None:
    async with running_api(settings_for(db_url)) as api:
        r = await api.client.post("/jobs", json=body, headers=bearer(token_a))
        assert r.status_code == status, r.text
        assert r.json()["detail"][0]["loc"][: len(where)] == where
    assert job_count(db_url) == 0


async def test_submit_refuses_what_postgres_would_reject(db_url: str, token_a: str) -> None:
    """NaN and lone surrogates parse as JSON in Python but not in jsonb: 422, not 500."""
    async with running_api(settings_for(db_url)) as api:
        for raw in (
            b'{"type": "t", "payload": {"x": NaN}}',
            b'{"type": "t", "payload": {"x": 1e400}}',
            b'{"type": "t", "payload": {"x": "\\ud800"}}',
            b'{"type": "t\\ud800"}',
            b'{"type": "t", "dedup_key": "k\\ud800"}',
            b'{"type": "t", "dedup_key": "k\\u0000"}',
            b'{"type": "t", "concurrency_key": "\\udfff"}',
            b'{"type": "t", "queue": "q\\ud800"}',
        ):
            r = await api.client.post(
                "/jobs",
                content=raw,
                headers={**bearer(token_a), "content-type": "application/json"},
            )
            assert r.status_code == 422, (raw, r.text)
    assert job_count(db_url) == 0


async def test_malformed_json_is_422(db_url: str, token_a: str) -> None:
    async with running_api(settings_for(db_url)) as api:
        for raw in (
            b'{"type": "t", ',
            b"\xff\xfe not utf-8",
            b"[" * 100_000 + b"]" * 100_000,  # deeper than the parser goes
        ):
            r = await api.client.post(
                "/jobs",
                content=raw,
                headers={**bearer(token_a), "content-type": "application/json"},
            )
            assert r.status_code == 422, (raw[:20], r.text)
            assert r.json()["detail"][0]["type"] == "json_invalid"
    assert job_count(db_url) == 0


async def test_payload_over_the_cap_is_413(db_url: str, token_a: str) -> None:
    async with running_api(settings_for(db_url, max_payload_bytes=1000)) as api:
        r = await submit(api, token_a, payload={"blob": "x" * 2000})
        assert r.status_code == 413
        assert r.json()["detail"]["code"] == "payload_too_large"
        # a body over the body cap is refused before it is read (here 2*1000 + 64 KiB)
        big = json.dumps({"type": "t", "payload": {"blob": "x" * 100_000}}).encode()
        r = await api.client.post(
            "/jobs", content=big, headers={**bearer(token_a), "content-type": "application/json"}
        )
        assert r.status_code == 413
        assert r.json()["detail"]["code"] == "body_too_large"

        async def chunks() -> Any:  # no Content-Length: counted as it streams
            for _ in range(100):
                yield b" " * 1000

        r = await api.client.post(
            "/jobs",
            content=chunks(),
            headers={**bearer(token_a), "content-type": "application/json"},
        )
        assert r.status_code == 413
        assert r.json()["detail"]["code"] == "body_too_large"
    assert job_count(db_url) == 0


async def test_tokens_missing_wrong_and_revoked_are_401(db_url: str, token_a: str) -> None:
    async with running_api(settings_for(db_url)) as api:
        for headers in (
            {},
            {"Authorization": "Bearer nope"},
            bearer("jobsd_" + "A" * 43),
            {"Authorization": f"Basic {token_a}"},
        ):
            r = await api.client.post("/jobs", json={"type": "t"}, headers=headers)
            assert r.status_code == 401, headers
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["detail"]["code"] == "unauthorized"
            r = await api.client.get("/jobs", headers=headers)
            assert r.status_code == 401
        assert (await submit(api, token_a)).status_code == 202
        with psycopg.connect(db_url, autocommit=True) as conn:
            assert revoke_token(conn, OPERATOR, token_a) is not None
        assert (await submit(api, token_a)).status_code == 401
        # a second token of the same org still works
        assert (await submit(api, make_token(db_url, "acme"))).status_code == 202
    assert job_count(db_url) == 2


async def test_list_is_newest_first_with_keyset_cursor_and_filters(
    db_url: str, token_a: str, token_b: str
) -> None:
    async with running_api(settings_for(db_url)) as api:
        ids = []
        for i in range(7):
            r = await submit(api, token_a, type="even" if i % 2 == 0 else "odd")
            ids.append(r.json()["id"])
        await submit(api, token_b)
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 3}
            if cursor:
                params["cursor"] = cursor
            page = (await api.client.get("/jobs", params=params, headers=bearer(token_a))).json()
            pages += 1
            seen += [j["id"] for j in page["jobs"]]
            assert all("payload" not in j for j in page["jobs"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == 3
        assert seen == ids[::-1]
        odd = await api.client.get("/jobs", params={"type": "odd"}, headers=bearer(token_a))
        assert [j["id"] for j in odd.json()["jobs"]] == [ids[5], ids[3], ids[1]]
        await api.client.post(f"/jobs/{ids[0]}/cancel", headers=bearer(token_a))
        cancelled = await api.client.get(
            "/jobs", params={"status": "cancelled", "queue": "default"}, headers=bearer(token_a)
        )
        assert [j["id"] for j in cancelled.json()["jobs"]] == [ids[0]]
        for params in ({"cursor": "garbage"}, {"status": "done"}, {"limit": 0}, {"limit": 201}):
            r = await api.client.get("/jobs", params=params, headers=bearer(token_a))
            assert r.status_code == 422, params


async def test_cancel_queued_then_again_then_finished_and_running(
    db_url: str, token_a: str
) -> None:
    async with running_api(settings_for(db_url)) as api:
        job = (await submit(api, token_a, dedup_key="once")).json()
        r = await api.client.post(f"/jobs/{job['id']}/cancel", headers=bearer(token_a))
        assert r.status_code == 200
        assert r.json()["status"] == "cancelled"
        assert r.json()["reason"] == "cancelled by API"
        assert r.json()["finished_at"] is not None
        again = await api.client.post(f"/jobs/{job['id']}/cancel", headers=bearer(token_a))
        assert again.status_code == 200 and again.json()["status"] == "cancelled"
        detail = (await api.client.get(f"/jobs/{job['id']}", headers=bearer(token_a))).json()
        assert [(h["from"], h["to"], h["worker"]) for h in detail["history"]] == [
            (None, "queued", None),
            ("queued", "cancelled", "api"),
        ]
        # the dedup key is released: a new job may take it
        fresh = (await submit(api, token_a, dedup_key="once")).json()
        assert fresh["id"] != job["id"]

        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE jobsd.jobs SET status = 'running', started_at = now(), attempts = 1, "
                "lease_id = gen_random_uuid(), worker_id = 'w1' WHERE id = %s",
                (fresh["id"],),
            )
        # running: a cancel request for its owner (202), the job still running
        r = await api.client.post(f"/jobs/{fresh['id']}/cancel", headers=bearer(token_a))
        assert r.status_code == 202
        assert r.json()["status"] == "running"
        with psycopg.connect(db_url, autocommit=True) as conn:
            first = conn.execute(
                "SELECT cancel_requested_at FROM jobsd.jobs WHERE id = %s", (fresh["id"],)
            ).fetchone()
            assert first is not None and first[0] is not None
            again = await api.client.post(f"/jobs/{fresh['id']}/cancel", headers=bearer(token_a))
            assert again.status_code == 202
            second = conn.execute(
                "SELECT cancel_requested_at FROM jobsd.jobs WHERE id = %s", (fresh["id"],)
            ).fetchone()
            assert second == first, "a repeated request keeps the first one's time"
            conn.execute(
                "UPDATE jobsd.jobs SET status = 'succeeded', finished_at = now() WHERE id = %s",
                (fresh["id"],),
            )
        r = await api.client.post(f"/jobs/{fresh['id']}/cancel", headers=bearer(token_a))
        assert r.status_code == 409
        assert r.json()["detail"]["code"] == "job_finished"
        r = await api.client.post(f"/jobs/{uuid.uuid4()}/cancel", headers=bearer(token_a))
        assert r.status_code == 404
