"""Every operation through every front end, as every kind of caller: the same answers and
the same rows.

The operations (read, list, cancel, retry, resolve, pause and resume a queue) go
through the Python client, the command line, the HTTP API and the dashboard, as an
org's token, an operator, and an org's token made ``--admin`` before such tokens
became an operator's only. Each front end gets fresh rows: a job of the caller's org
("mine") and one of another org ("theirs"), or a queue of its own. The answers are
reduced to what they mean (found and changed, not found, refused) and compared, with
the rows they left, to one expectation per operation and caller.

Two pairs are not asked: the client and the command line change queues only as the
operator (a client holds the database's URL; ``jobsd queue`` takes no token).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import psycopg
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from apikit import Api, bearer, running_api, settings_for
from click.testing import CliRunner
from support.jobs import make_job
from support.tokens import stored_token

from jobsd.cli.app import main as jobsd_main
from jobsd.client import Client
from jobsd.errors import Forbidden, JobNotFound

ORG, OTHER = "acme", "globex"
CALLERS = ("org", "operator", "old_admin")
OPERATIONS = ("get", "list", "cancel", "retry", "resolve", "pause", "resume")
FRONTS = ("client", "cli", "http", "dashboard")
# the state a job of each operation starts in
START = {"get": "queued", "list": "queued", "cancel": "queued", "retry": "failed"}
START["resolve"] = "recovery_required"

Answer = tuple[Any, ...]


@dataclass
class World:
    """One database, an API, the tokens of the three callers, a dashboard session each."""

    db_url: str
    portal: BlockingPortal
    api: Api
    tokens: dict[str, str]
    csrf: dict[str, str]
    cookies: dict[str, httpx.Cookies]

    def http(self, method: str, path: str, caller: str, **kw: Any) -> httpx.Response:
        headers = bearer(self.tokens[caller])
        return self.portal.call(
            lambda: self.api.client.request(method, path, headers=headers, **kw)
        )

    def page(self, method: str, path: str, caller: str, **kw: Any) -> httpx.Response:
        self.api.client.cookies = self.cookies[caller]
        if method == "POST":
            kw["data"] = {"csrf": self.csrf[caller], **kw.get("data", {})}
        return self.portal.call(lambda: self.api.client.request(method, path, **kw))

    def client(self, call: Callable[[Client], Any]) -> Any:
        async def run() -> Any:
            async with Client(self.db_url) as client:
                return await call(client)

        return self.portal.call(run)


@contextmanager
def world(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setenv("JOBSD_DATABASE_URL", db_url)
    monkeypatch.delenv("JOBSD_TOKEN", raising=False)
    tokens = {
        "org": stored_token(db_url, ORG, admin=False),
        "operator": stored_token(db_url, None, admin=True),
        "old_admin": stored_token(db_url, ORG, admin=True),
    }
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(running_api(settings_for(db_url))) as api,
    ):
        csrf: dict[str, str] = {}
        cookies: dict[str, httpx.Cookies] = {}
        for caller, made in tokens.items():
            api.client.cookies = httpx.Cookies()
            login = portal.call(partial(api.client.post, "/ui/login", data={"token": made}))
            assert login.status_code == 303, login.text
            page = portal.call(api.client.get, "/ui")
            found = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert found, page.text
            csrf[caller], cookies[caller] = found.group(1), httpx.Cookies(api.client.cookies)
        yield World(db_url, portal, api, tokens, csrf, cookies)


def _ok_or_not_found(status: int, ok: int, answer: Answer) -> Answer:
    if status == 404:
        return ("not_found",)
    if status == 403:
        return ("forbidden",)
    assert status == ok, status
    return answer


def via_client(w: World, op: str, caller: str, target: str) -> Answer:
    org = None if caller == "operator" else ORG
    try:
        match op:
            case "get":
                return ("ok", str(w.client(lambda c: c.get(target, org_id=org)).status))
            case "cancel":
                return ("cancelled",) if w.client(lambda c: c.cancel(target, org_id=org)) else ()
            case "retry":
                return ("retried",) if w.client(lambda c: c.retry(target, org_id=org)) else ()
            case "resolve":
                job = w.client(lambda c: c.resolve(target, "succeeded", org_id=org))
                return ("resolved", str(job.status))
            case "pause" | "resume":
                w.client(lambda c: getattr(c, f"{op}_queue")(target))
                return ("ok",)
    except JobNotFound:
        return ("not_found",)
    except Forbidden:
        return ("forbidden",)
    raise AssertionError(op)


def via_cli(w: World, op: str, caller: str, target: str) -> Answer:
    token = [] if caller == "operator" else ["--token", w.tokens[caller]]
    args = {
        "get": ["status", target, "--json"],
        "cancel": ["cancel", target],
        "retry": ["retry", target],
        "resolve": ["resolve", target, "--succeeded"],
        "pause": ["queue", "pause", target],
        "resume": ["queue", "resume", target],
    }[op]
    result = CliRunner().invoke(jobsd_main, args + (token if op not in ("pause", "resume") else []))
    if result.exit_code == 1 and "not found" in result.stderr:
        return ("not_found",)
    assert result.exit_code == 0, result.output
    match op:
        case "get":
            return ("ok", json.loads(result.stdout)["status"])
        case "cancel":
            return ("cancelled",)
        case "retry":
            return ("retried",)
        case "resolve":
            return ("resolved", result.stdout.split()[-1])
    return ("ok",)


def via_http(w: World, op: str, caller: str, target: str) -> Answer:
    match op:
        case "get":
            r = w.http("GET", f"/jobs/{target}", caller)
            return _ok_or_not_found(r.status_code, 200, ("ok", r.json().get("status")))
        case "cancel":
            r = w.http("POST", f"/jobs/{target}/cancel", caller)
            return _ok_or_not_found(r.status_code, 200, ("cancelled",))
        case "retry":
            r = w.http("POST", f"/jobs/{target}/retry", caller)
            return _ok_or_not_found(r.status_code, 202, ("retried",))
        case "resolve":
            r = w.http("POST", f"/jobs/{target}/resolve", caller, json={"outcome": "succeeded"})
            return _ok_or_not_found(r.status_code, 200, ("resolved", r.json().get("status")))
    r = w.http("POST", f"/queues/{target}/{op}", caller)
    return _ok_or_not_found(r.status_code, 200, ("ok",))


def via_dashboard(w: World, op: str, caller: str, target: str) -> Answer:
    match op:
        case "get":
            r = w.page("GET", f"/ui/jobs/{target}", caller)
            found = re.search(r'id="job-status">([a-z_]+)<', r.text)
            return _ok_or_not_found(r.status_code, 200, ("ok", found.group(1) if found else None))
        case "cancel" | "retry":
            r = w.page("POST", f"/ui/jobs/{target}/{op}", caller)
            return _ok_or_not_found(r.status_code, 303, (f"{op.rstrip('y')}ied",)
                                    if op == "retry" else ("cancelled",))  # fmt: skip
        case "resolve":
            r = w.page("POST", f"/ui/jobs/{target}/resolve", caller, data={"outcome": "succeeded"})
            return _ok_or_not_found(r.status_code, 303, ("resolved", "succeeded"))
    r = w.page("POST", f"/ui/queues/{target}/{op}", caller)
    return _ok_or_not_found(r.status_code, 303, ("ok",))


def listed(w: World, front: str, caller: str) -> set[str]:
    """Return the ids a listing shows (every page of 1,000 at most: the test has fewer)."""
    match front:
        case "client":
            org = None if caller == "operator" else ORG
            page = w.client(lambda c: c.list(org_id=org, limit=1000))
            return {str(j.id) for j in page.jobs}
        case "cli":
            token = [] if caller == "operator" else ["--token", w.tokens[caller]]
            result = CliRunner().invoke(
                jobsd_main, ["jobs", "list", "--json", "--limit", "1000", *token]
            )
            assert result.exit_code == 0, result.output
            return {json.loads(line)["id"] for line in result.stdout.splitlines()}
        case "http":
            r = w.http("GET", "/jobs", caller, params={"limit": 200})
            assert r.status_code == 200, r.text
            return {j["id"] for j in r.json()["jobs"]}
    r = w.page("GET", "/ui/jobs", caller, params={"limit": 200})
    assert r.status_code == 200
    return set(re.findall(r"/ui/jobs/([0-9a-f-]{36})", r.text))


FRONT = {"client": via_client, "cli": via_cli, "http": via_http, "dashboard": via_dashboard}


def rows(db_url: str, job_ids: dict[str, uuid.UUID]) -> dict[str, tuple[Any, ...]]:
    """Each job's status and how many retries it has."""
    out: dict[str, tuple[Any, ...]] = {}
    with psycopg.connect(db_url, autocommit=True) as conn:
        for name, job_id in job_ids.items():
            found = conn.execute(
                "SELECT status, (SELECT count(*) FROM jobsd.jobs AS r WHERE r.retry_of = j.id) "
                "FROM jobsd.jobs AS j WHERE id = %s",
                (job_id,),
            ).fetchone()
            assert found is not None
            out[name] = tuple(found)
    return out


def expected_job(op: str, caller: str) -> tuple[dict[str, Answer], dict[str, tuple[Any, ...]]]:
    """The answers for (mine, theirs) and the rows they leave."""
    done = {
        "get": (("ok", "queued"), ("queued", 0)),
        "cancel": (("cancelled",), ("cancelled", 0)),
        "retry": (("retried",), ("failed", 1)),
        "resolve": (("resolved", "succeeded"), ("succeeded", 0)),
    }[op]
    untouched = (START[op], 0)
    theirs = done if caller == "operator" else (("not_found",), untouched)
    return {"mine": done[0], "theirs": theirs[0]}, {"mine": done[1], "theirs": theirs[1]}


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("op", OPERATIONS)
def test_every_operation_answers_the_same_through_every_front_end(
    db_url: str, monkeypatch: pytest.MonkeyPatch, op: str, caller: str
) -> None:
    seen: dict[str, Any] = {}
    with world(db_url, monkeypatch) as w:
        for front in FRONTS:
            if op in ("pause", "resume"):
                if front in ("client", "cli") and caller != "operator":
                    continue  # see the module's docstring
                name = f"q{uuid.uuid4().hex[:8]}"
                with psycopg.connect(db_url, autocommit=True) as conn:
                    paused = "now()" if op == "resume" else "NULL"
                    conn.execute(
                        f"INSERT INTO jobsd.queues (name, paused_at) VALUES (%s, {paused})",
                        (name,),
                    )
                answer = FRONT[front](w, op, caller, name)
                with psycopg.connect(db_url, autocommit=True) as conn:
                    row = conn.execute(
                        "SELECT paused_at IS NOT NULL FROM jobsd.queues WHERE name = %s", (name,)
                    ).fetchone()
                seen[front] = (answer, row)
                continue
            with psycopg.connect(db_url, autocommit=True) as conn:
                job_ids = {
                    "mine": make_job(conn, org_id=ORG, status=START[op]),
                    "theirs": make_job(conn, org_id=OTHER, status=START[op]),
                }
            if op == "list":
                shown = listed(w, front, caller)
                seen[front] = {k for k, v in job_ids.items() if str(v) in shown}
                continue
            answers = {k: FRONT[front](w, op, caller, str(v)) for k, v in job_ids.items()}
            seen[front] = (answers, rows(db_url, job_ids))
    if op == "list":
        want_list = {"mine", "theirs"} if caller == "operator" else {"mine"}
        assert seen == dict.fromkeys(FRONTS, want_list)
    elif op in ("pause", "resume"):
        allowed = caller == "operator"
        end = (op == "pause") if allowed else (op == "resume")
        want = (("ok",) if allowed else ("forbidden",), (end,))
        assert seen == {f: want for f in seen}, seen
        assert set(seen) == (set(FRONTS) if allowed else {"http", "dashboard"})
    else:
        assert seen == dict.fromkeys(FRONTS, expected_job(op, caller))
