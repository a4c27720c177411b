"""The queue endpoints (/queues) in-process against a real Postgres: admin tokens only,
every answer, the wake-up of a resume, and the API under the least-privilege roles."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import httpx
import psycopg
import pytest
import schemathesis
from anyio.from_thread import start_blocking_portal
from apikit import Api, bearer, db_scalar, http_settings, running_api, settings_for
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from psycopg.conninfo import make_conninfo
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from support.jobs import make_job

from jobsd.admin.roles import RoleNames, create_roles, drop_roles
from jobsd.http.openapi import openapi_schema
from jobsd.http.server import serve
from jobsd.ops import Caller
from jobsd.ops.tokens import create_token, revoke_token

OPERATOR = Caller.as_operator("tests")

pytestmark = pytest.mark.anyio


def make_admin_token(db_url: str) -> str:
    """Create an operator's bearer token (admin, of no org) and return it."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        token, info = create_token(conn, OPERATOR, None, "ops", admin=True)
    assert info.admin and info.org_id is None
    return token


@pytest.fixture
def admin(db_url: str) -> str:
    """Return an operator token."""
    return make_admin_token(db_url)


def insert_job(db_url: str, *, queue: str, org_id: str, status: str = "queued") -> str:
    """Insert a job as the superuser (every org), walked to ``status``; return its id."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        return str(make_job(conn, queue=queue, org_id=org_id, status=status))


def queue_names(db_url: str) -> list[str]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT name FROM jobsd.queues ORDER BY name")]


def jobs_in(db_url: str, queue: str) -> int:
    return int(db_scalar(db_url, "SELECT count(*) FROM jobsd.jobs WHERE queue = %s", queue))


async def call(api: Api, token: str | None, method: str, path: str, **kw: Any) -> httpx.Response:
    headers = bearer(token) if token else {}
    return await api.client.request(method, path, headers=headers, **kw)


ZERO = {"queued": 0, "scheduled": 0, "blocked": 0, "running": 0, "recovery_required": 0}


async def test_an_admin_token_declares_changes_pauses_resumes_and_drops(
    db_url: str, admin: str
) -> None:
    async with running_api(settings_for(db_url)) as api:
        r = await call(api, admin, "POST", "/queues", json={"name": "mail", "capacity": 10})
        assert r.status_code == 201, r.text
        created = r.json()
        assert {k: created[k] for k in ("name", "paused", "paused_at", "capacity")} == {
            "name": "mail",
            "paused": False,
            "paused_at": None,
            "capacity": 10,
        }
        assert (created["concurrency_limit"], created["retention_days"]) == (None, None)
        assert created["depth"] == ZERO

        r = await call(api, admin, "POST", "/queues", json={"name": "mail", "capacity": 99})
        assert r.status_code == 409, r.text
        assert r.json()["detail"]["code"] == "queue_exists"
        assert "exists already" in r.json()["detail"]["message"]

        # depth counts every org's open jobs, not only the token's org
        insert_job(db_url, queue="mail", org_id="acme")
        insert_job(db_url, queue="mail", org_id="globex")
        insert_job(db_url, queue="mail", org_id="globex", status="running")
        insert_job(db_url, queue="mail", org_id="globex", status="succeeded")
        r = await call(api, admin, "GET", "/queues")
        assert r.status_code == 200, r.text
        listed = {q["name"]: q for q in r.json()["queues"]}
        assert list(listed) == ["default", "mail"]
        assert listed["mail"]["depth"] == {**ZERO, "queued": 2, "running": 1}
        r = await call(api, admin, "GET", "/queues/mail")
        assert r.status_code == 200 and r.json() == listed["mail"]

        # PATCH: a field left out stays, null removes the limit
        r = await call(api, admin, "PATCH", "/queues/mail", json={"retention_days": 30})
        assert r.status_code == 200, r.text
        assert (r.json()["capacity"], r.json()["retention_days"]) == (10, 30)
        r = await call(
            api, admin, "PATCH", "/queues/mail", json={"capacity": None, "concurrency_limit": 2}
        )
        assert (r.json()["capacity"], r.json()["concurrency_limit"]) == (None, 2)
        assert r.json()["retention_days"] == 30
        r = await call(api, admin, "PATCH", "/queues/mail", json={})
        assert r.status_code == 200 and r.json()["concurrency_limit"] == 2

        # pause and resume, each twice
        first = await call(api, admin, "POST", "/queues/mail/pause")
        assert first.status_code == 200 and first.json()["paused"] is True
        again = await call(api, admin, "POST", "/queues/mail/pause")
        assert again.json()["paused_at"] == first.json()["paused_at"]
        for _ in range(2):
            r = await call(api, admin, "POST", "/queues/mail/resume")
            assert r.status_code == 200 and r.json()["paused"] is False

        # drop: the owner's, on the command line; through the API refused, nothing deleted
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE jobsd.jobs SET status = 'cancelled', finished_at = now() "
                "WHERE status <> 'succeeded'"
            )
        r = await call(api, admin, "DELETE", "/queues/mail")
        assert r.status_code == 403, r.text
        assert r.json()["detail"]["code"] == "cli_only"
        assert "jobsd queue drop" in r.json()["detail"]["message"]
        assert jobs_in(db_url, "mail") == 4 and "mail" in queue_names(db_url)

        for method, path in [
            ("GET", "/queues/nomail"),
            ("PATCH", "/queues/nomail"),
            ("POST", "/queues/nomail/pause"),
            ("POST", "/queues/nomail/resume"),
        ]:
            r = await call(api, admin, method, path, json={} if method == "PATCH" else None)
            assert r.status_code == 404, (method, path, r.text)
            detail = r.json()["detail"]
            assert (detail["code"], detail["message"]) == (
                "queue_not_found",
                "queue 'nomail' not found",
            )


async def test_tokens_that_are_not_admin_get_403_and_change_nothing(
    db_url: str, token_a: str, admin: str
) -> None:
    requests: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", "/queues", None),
        ("POST", "/queues", {"name": "mail"}),
        ("GET", "/queues/default", None),
        ("PATCH", "/queues/default", {"capacity": 1}),
        ("POST", "/queues/default/pause", None),
        ("POST", "/queues/default/resume", None),
        ("DELETE", "/queues/other", None),
        # even with a bad body or name: the token is refused first
        ("POST", "/queues", {"name": "bad name", "capacity": 0}),
    ]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobsd.queues (name) VALUES ('other')")
        before = conn.execute("SELECT * FROM jobsd.queues ORDER BY name").fetchall()
    revoked = make_admin_token(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert revoke_token(conn, OPERATOR, revoked) is not None
    async with running_api(settings_for(db_url)) as api:
        for method, path, body in requests:
            r = await call(api, token_a, method, path, json=body)
            assert r.status_code == 403, (method, path, r.text)
            detail = r.json()["detail"]
            assert detail["code"] == "admin_required"
            assert "jobsd token create --admin" in detail["message"]

            r = await call(api, None, method, path, json=body)
            assert r.status_code == 401, (method, path, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["detail"]["code"] == "unauthorized"

            r = await call(api, revoked, method, path, json=body)
            assert r.status_code == 401, (method, path, r.text)
        # the same token still does what it did: submit into its org
        r = await call(api, token_a, "POST", "/jobs", json={"type": "t"})
        assert r.status_code == 202, r.text
        # an operator token reads every org's jobs, and submits none: a job needs an org
        job_id = r.json()["id"]
        r = await call(api, admin, "GET", f"/jobs/{job_id}")
        assert r.status_code == 200 and r.json()["org_id"] == "acme", r.text
        r = await call(api, admin, "POST", "/jobs", json={"type": "t"})
        assert r.status_code == 403 and r.json()["detail"]["code"] == "org_required", r.text
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT * FROM jobsd.queues ORDER BY name").fetchall() == before


@pytest.mark.parametrize(
    ("method", "path", "body", "where"),
    [
        ("POST", "/queues", {"name": "bad name"}, ["body", "name"]),
        ("POST", "/queues", {"name": "-lead"}, ["body", "name"]),
        ("POST", "/queues", {"name": "x" * 64}, ["body", "name"]),
        ("POST", "/queues", {"name": ""}, ["body", "name"]),
        ("POST", "/queues", {}, ["body", "name"]),
        ("POST", "/queues", {"name": "mail", "capacity": 0}, ["body", "capacity"]),
        ("POST", "/queues", {"name": "mail", "capacity": -5}, ["body", "capacity"]),
        ("POST", "/queues", {"name": "mail", "capacity": 2**31}, ["body", "capacity"]),
        ("POST", "/queues", {"name": "mail", "capacity": 1.5}, ["body", "capacity"]),
        (
            "POST",
            "/queues",
            {"name": "mail", "concurrency_limit": 0},
            ["body", "concurrency_limit"],
        ),
        ("POST", "/queues", {"name": "mail", "retention_days": -1}, ["body", "retention_days"]),
        ("POST", "/queues", {"name": "mail", "paused": True}, ["body", "paused"]),
        ("PATCH", "/queues/default", {"capacity": 0}, ["body", "capacity"]),
        ("PATCH", "/queues/default", {"name": "renamed"}, ["body", "name"]),
        ("GET", "/queues/bad%20name", None, ["path", "name"]),
        ("POST", "/queues/-x/pause", None, ["path", "name"]),
        ("DELETE", "/queues/" + "x" * 64, None, ["path", "name"]),
    ],
)
async def test_bad_input_is_a_422_on_the_field(
    db_url: str, admin: str, method: str, path: str, body: Any, where: list[str]
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        before = conn.execute("SELECT * FROM jobsd.queues ORDER BY name").fetchall()
    async with running_api(settings_for(db_url)) as api:
        r = await call(api, admin, method, path, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == where
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT * FROM jobsd.queues ORDER BY name").fetchall() == before


async def test_no_queue_is_dropped_through_the_api(db_url: str, admin: str) -> None:
    async with running_api(settings_for(db_url)) as api:
        r = await call(api, admin, "DELETE", "/queues/default")
    assert r.status_code == 403, r.text
    assert r.json()["detail"]["code"] == "cli_only"
    assert queue_names(db_url) == ["default"]


async def test_a_resume_wakes_listening_daemons_with_the_queue_name(
    db_url: str, admin: str
) -> None:
    async with (
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener,
        running_api(settings_for(db_url)) as api,
    ):
        await listener.execute("LISTEN jobsd")
        r = await call(api, admin, "POST", "/queues", json={"name": "mail"})
        assert r.status_code == 201
        await call(api, admin, "POST", "/queues/mail/pause")
        r = await call(api, admin, "POST", "/queues/mail/resume")
        assert r.status_code == 200, r.text
        # within 5 s, or the wait ends empty-handed
        got = [n async for n in listener.notifies(timeout=5.0, stop_after=1)]
        assert [(n.channel, n.payload) for n in got] == [("jobsd", "mail")]


@pytest.fixture
def roles(db_url: str) -> Iterator[RoleNames]:
    """The least-privilege roles on the test's database (a unique prefix), dropped after."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    create_roles(db_url, prefix=prefix)
    try:
        yield RoleNames.for_prefix(prefix)
    finally:
        drop_roles(db_url, prefix=prefix)


async def test_the_api_administers_queues_under_its_own_role(
    db_url: str, admin: str, roles: RoleNames
) -> None:
    api_url = make_conninfo(db_url, user=roles.api)
    insert_job(db_url, queue="default", org_id="acme")
    insert_job(db_url, queue="default", org_id="globex")
    insert_job(db_url, queue="default", org_id="initech", status="running")
    async with running_api(settings_for(api_url)) as api:
        # the role sees one org's jobs at a time, yet the depth counts every org's
        r = await call(api, admin, "GET", "/queues/default")
        assert r.status_code == 200, r.text
        assert r.json()["depth"] == {**ZERO, "queued": 2, "running": 1}

        r = await call(api, admin, "POST", "/queues", json={"name": "mail", "capacity": 2})
        assert r.status_code == 201, r.text
        r = await call(api, admin, "PATCH", "/queues/mail", json={"retention_days": 1})
        assert r.status_code == 200 and r.json()["retention_days"] == 1, r.text
        assert (await call(api, admin, "POST", "/queues/mail/pause")).json()["paused"]
        assert not (await call(api, admin, "POST", "/queues/mail/resume")).json()["paused"]
        r = await call(api, admin, "DELETE", "/queues/mail")
        assert r.status_code == 403, r.text
    assert queue_names(db_url) == ["default", "mail"]

    # the read role may list queues, not change them
    read_url = make_conninfo(db_url, user=roles.read)
    async with running_api(settings_for(read_url)) as api:
        r = await call(api, admin, "GET", "/queues")
        assert r.status_code == 200 and [q["name"] for q in r.json()["queues"]] == [
            "default",
            "mail",
        ]
        r = await call(api, admin, "POST", "/queues", json={"name": "mail2"})
        assert r.status_code == 503, r.text
    assert queue_names(db_url) == ["default", "mail"]

    # and the worker, the enqueue and the API's role may not drop a queue by hand
    for role in (roles.worker, roles.enqueue, roles.api):
        with (
            psycopg.connect(make_conninfo(db_url, user=role), autocommit=True) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute("SELECT jobsd.queue_drop('mail')")


@pytest.mark.slow
def test_property_based_queue_calls_find_no_server_error(db_url: str) -> None:
    """Every queue operation, valid and invalid inputs, with an admin token: no 500."""
    token = make_admin_token(db_url)
    schema = schemathesis.openapi.from_dict(openapi_schema())
    http = http_settings(longpoll_max=0.2, ready_timeout=2.0)
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    calls = 0
    with start_blocking_portal(backend="asyncio") as portal:
        future, (host, port) = portal.start_task(partial(serve, settings_for(db_url), http))
        base_url = f"http://{host}:{port}"
        try:
            for result in schema.get_all_operations():
                assert isinstance(result, Ok), result
                operation = result.ok()
                if not operation.path.startswith("/queues"):
                    continue
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                    @given(case=operation.as_strategy(generation_mode=mode))
                    @settings(
                        max_examples=25,
                        deadline=None,
                        database=None,
                        phases=[Phase.generate, Phase.shrink],
                        suppress_health_check=list(HealthCheck),
                    )
                    def run(case: Any) -> None:
                        nonlocal calls
                        calls += 1
                        response = case.call(base_url=base_url, headers=bearer(token))
                        case.validate_response(response, checks=checks)

                    try:
                        run()
                    except Unsatisfiable:
                        assert mode is GenerationMode.NEGATIVE
        finally:
            future.cancel()
    assert calls > 100
    assert "default" in queue_names(db_url)
