"""The HTTP API under the least-privilege roles, with row-level security behind every query.

The app runs in-process with its database URL set to the enqueue role or to the read
role (no org in the URL: each request sets it for its own transaction). The token's
org works; another org's job is 404 everywhere; /metrics and /health still count
every org.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
import pytest

from jobsd.client import Client, JobSpec, SyncClient
from jobsd.errors import DuplicateJob
from jobsd.http.app import create_app
from jobsd.http.settings import HttpSettings
from jobsd.ops import Caller
from jobsd.ops.tokens import create_token
from jobsd.settings import Settings
from jobsd.store import api as api_queries
from jobsd.store import queries
from jobsd.store.db import make_async_pool
from jobsd.worker.executor import ERROR_MAX_BYTES

from .conftest import FAST, Roles

OPERATOR = Caller.as_operator("tests")

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def api_as(url: str, **http: Any) -> AsyncIterator[httpx.AsyncClient]:
    """Run jobsd's app on ``url`` (its lifespan in this loop) and call it in-process."""
    app = create_app(
        Settings(database_url=url, **{**FAST, "max_payload_bytes": 1000}),
        HttpSettings(**{"http_addr": None, "longpoll_max": 1.0, **http}),
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
            yield client


def _bearer(db_url: str, org_id: str) -> dict[str, str]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        token, _ = create_token(conn, OPERATOR, org_id, "tests")
    return {"Authorization": f"Bearer {token}"}


def _insert(db_url: str, org_id: str, **overrides: Any) -> str:
    """Insert a job as the superuser (no row-level security) and return its id."""
    spec = JobSpec.build("t", {"org": org_id}, org_id=org_id, **overrides)
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = queries.run_named_sync(conn, "jobs_insert", spec.insert_params())
    return str(rows[0]["id"])


def _events(db_url: str) -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM jobsd.all_job_events").fetchone()
    return int(row[0]) if row else 0


def _jobs(db_url: str) -> dict[str, tuple[str, str]]:
    """Return every job as the superuser sees it: id -> (org, status)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute("SELECT id::text, org_id, status FROM jobsd.jobs").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def _depth(metrics: str) -> dict[tuple[str, str], float]:
    found = re.findall(
        r'^jobsd_queue_depth\{queue="([^"]+)",status="([^"]+)"\} (\S+)$', metrics, re.M
    )
    return {(queue, status): float(value) for queue, status, value in found}


async def _assert_counts_every_org(client: httpx.AsyncClient, queued: int) -> None:
    metrics = (await client.get("/metrics")).text
    assert "jobsd_database_up 1.0" in metrics
    assert _depth(metrics)[("default", "queued")] == queued
    report = (await client.get("/health")).json()
    assert report["database"] is True
    assert report["oldest_queued_age_s"] is not None  # every org's queued jobs
    assert report["dead_tuples"] is not None and report["live_tuples"] is not None


async def test_api_as_enqueue_role_serves_its_org_only(roles: Roles) -> None:
    db = roles.db_url
    acme, globex = _bearer(db, "acme"), _bearer(db, "globex")
    theirs = _insert(db, "globex")
    async with api_as(roles.url("enqueue")) as client:
        r = await client.post("/jobs", json={"type": "t", "payload": {"n": 1}}, headers=acme)
        assert r.status_code == 202, r.text
        mine = r.json()["id"]
        # a retried submission with the same id returns the same job (re-read under RLS)
        again = await client.post("/jobs", json={"type": "t", "id": mine}, headers=acme)
        assert again.status_code == 202 and again.json()["id"] == mine

        r = await client.get(f"/jobs/{mine}", headers=acme)
        assert r.status_code == 200, r.text
        assert [(h["from"], h["to"]) for h in r.json()["history"]] == [(None, "queued")]
        listed = (await client.get("/jobs", headers=acme)).json()["jobs"]
        assert [j["id"] for j in listed] == [mine]

        # the other org's job: not found, not listed, not cancelled, id not reusable
        assert (await client.get(f"/jobs/{theirs}", headers=acme)).status_code == 404
        assert (await client.get(f"/jobs/{theirs}?wait=0.1", headers=acme)).status_code == 404
        assert (await client.post(f"/jobs/{theirs}/cancel", headers=acme)).status_code == 404
        r = await client.post("/jobs", json={"type": "t", "id": theirs}, headers=acme)
        assert r.status_code == 409 and r.json()["detail"]["code"] == "id_in_use", r.text
        # ... while globex's own token sees it
        assert (await client.get(f"/jobs/{theirs}", headers=globex)).status_code == 200

        await _assert_counts_every_org(client, queued=2)

        r = await client.post(f"/jobs/{mine}/cancel", headers=acme)
        assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
        r = await client.post(f"/jobs/{mine}/cancel", headers=acme)  # repeated: 200 again
        assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
        r = await client.get(f"/jobs/{mine}", headers=acme)
        history = [(h["to"], h["worker"]) for h in r.json()["history"]]
        assert history == [("queued", None), ("cancelled", "api")]

    assert _jobs(db) == {mine: ("acme", "cancelled"), theirs: ("globex", "queued")}


async def test_api_as_read_role_reads_its_org_and_cannot_write(roles: Roles) -> None:
    db = roles.db_url
    acme = _bearer(db, "acme")
    mine, theirs = _insert(db, "acme"), _insert(db, "globex")
    _insert(db, "globex")
    before = _jobs(db)
    async with api_as(roles.url("read")) as client:
        r = await client.get(f"/jobs/{mine}", headers=acme)
        assert r.status_code == 200 and r.json()["org_id"] == "acme", r.text
        assert r.json()["history"][0]["to"] == "queued"  # job_events under RLS too
        listed = (await client.get("/jobs", headers=acme)).json()["jobs"]
        assert [j["id"] for j in listed] == [mine]
        assert (await client.get(f"/jobs/{theirs}", headers=acme)).status_code == 404

        await _assert_counts_every_org(client, queued=3)

        # a reader cannot write: a 503 with a correlation id (the database's text is in
        # the log, never in the answer), nothing written
        r = await client.post("/jobs", json={"type": "t"}, headers=acme)
        assert r.status_code == 503, r.text
        detail = r.json()["detail"]
        assert detail["code"] == "database_error" and detail["correlation_id"]
        assert "permission denied" not in r.text
        r = await client.post(f"/jobs/{mine}/cancel", headers=acme)
        assert r.status_code == 503 and r.json()["detail"]["code"] == "database_error"
    assert _jobs(db) == before


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipeline", "transaction"])
async def test_the_org_never_outlives_its_query(
    roles: Roles, pipeline: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One implicit transaction (pipeline), or an explicit one where libpq has no pipeline."""
    monkeypatch.setattr(api_queries, "_PIPELINE", pipeline)
    mine = _insert(roles.db_url, "acme")
    pool = make_async_pool(roles.url("read"), name="t", min_size=1, max_size=1, timeout_s=5)
    async with pool:
        async with pool.connection() as conn:
            rows = await api_queries.run_for_org(conn, "acme", "jobs_get", {"id": uuid.UUID(mine)})
            assert [str(r["id"]) for r in rows] == [mine]
            # the same connection, right after: no org, so nothing at all
            assert await queries.run_named(conn, "jobs_get", {"id": uuid.UUID(mine)}) == []
            cur = await conn.execute("SELECT current_setting('jobsd.org_id', true) AS org")
            assert (await cur.fetchone()) in ({"org": None}, {"org": ""})
        # an error rolls the whole implicit transaction back and leaves no org either
        async with pool.connection() as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await api_queries.run_for_org(
                    conn, "acme", "api_jobs_cancel", {"id": uuid.UUID(mine), "org_id": "acme"}
                )
            assert await queries.run_named(conn, "jobs_get", {"id": uuid.UUID(mine)}) == []


async def test_client_id_of_another_orgs_job_is_duplicate_job(roles: Roles) -> None:
    theirs = _insert(roles.db_url, "globex")
    url = roles.url("enqueue", org="acme")
    async with Client(url, settings=Settings(database_url=url, **FAST)) as client:
        with pytest.raises(DuplicateJob, match=theirs):
            await client.enqueue("t", {}, org_id="acme", job_id=theirs)
        # with a dedup key too: the id is what is taken
        with pytest.raises(DuplicateJob, match=theirs):
            await client.enqueue("t", {}, org_id="acme", job_id=theirs, dedup_key="k")
        mine = await client.enqueue("t", {}, org_id="acme", dedup_key="k")
        assert mine.org_id == "acme"
    with (
        SyncClient(url, settings=Settings(database_url=url, **FAST)) as sync_client,
        pytest.raises(DuplicateJob, match=theirs),
    ):
        sync_client.enqueue("t", {}, org_id="acme", job_id=theirs)
    assert _jobs(roles.db_url)[theirs] == ("globex", "queued")


async def test_every_refusal_is_a_4xx_and_writes_nothing(roles: Roles) -> None:
    db = roles.db_url
    acme = _bearer(db, "acme")
    theirs = _insert(db, "globex")
    before, events = _jobs(db), _events(db)
    json_headers = {**acme, "content-type": "application/json"}

    async def streamed() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(100):
            yield b" " * 1000

    async with api_as(roles.url("enqueue"), submit_rate="4/h") as client:
        refusals = [
            # payload over JOBSD_MAX_PAYLOAD_BYTES (1000 here)
            (
                413,
                await client.post(
                    "/jobs", json={"type": "t", "payload": {"b": "x" * 2000}}, headers=acme
                ),
            ),
            # body over the body cap, declared and streamed
            (413, await client.post("/jobs", content=b" " * 70_000, headers=json_headers)),
            (413, await client.post("/jobs", content=streamed(), headers=json_headers)),
            (422, await client.post("/jobs", content=b'{"type": ', headers=json_headers)),
            (422, await client.post("/jobs", json={"type": "t", "queue": "nope"}, headers=acme)),
            (409, await client.post("/jobs", json={"type": "t", "id": theirs}, headers=acme)),
        ]
        # the rate, 4 per hour: the payload 413, the unknown queue and the 409 above
        # passed validation and used three of them
        refusals.append((202, await client.post("/jobs", json={"type": "t"}, headers=acme)))
        refusals.append((429, await client.post("/jobs", json={"type": "t"}, headers=acme)))
    for expected, response in refusals:
        assert response.status_code == expected, (expected, response.text)
        if expected != 202:
            assert isinstance(response.json()["detail"], dict | list), response.text
    created = refusals[-2][1].json()["id"]
    assert refusals[-1][1].headers["Retry-After"].isdigit()
    assert _jobs(db) == {**before, created: ("acme", "queued")}
    assert _events(db) == events + 1


async def test_error_text_is_capped_when_read_through_the_api(roles: Roles) -> None:
    """A handler's huge error is stored capped (2 KiB) and read back whole, as the org."""
    job_id = _insert(roles.db_url, "acme")
    pool = make_async_pool(roles.url("worker"), name="t", min_size=1, max_size=1, timeout_s=5)
    async with pool, pool.connection() as conn:
        (claimed,) = await queries.claim_batch(
            conn, limit=1, worker_id="w", queues=None, keep_dedup_types=[]
        )
        assert claimed.lease_id is not None
        row = queries.FinishRow(
            job_id=claimed.id,
            lease_id=claimed.lease_id,
            status="failed",
            report_json=None,
            error="é" * 100_000,
            reason="handler error",
            progress=None,
        )
        await queries.finish_batch(conn, [row])
    async with api_as(roles.url("read")) as client:
        r = await client.get(f"/jobs/{job_id}", headers=_bearer(roles.db_url, "acme"))
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "failed"
    error = r.json()["error"]
    assert error.startswith("éé") and len(error.encode()) <= ERROR_MAX_BYTES
