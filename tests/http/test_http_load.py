"""Bounded load (issue 12): a flood of long-polls and probes cannot take the tenants'
submissions or the daemon down with it."""

from __future__ import annotations

import anyio
import httpx
import psycopg
import pytest
from apikit import (
    bearer,
    http_settings,
    make_token,
    running_daemon,
    served_api,
    settings_for,
    wait_until,
)

import jobsd
from jobsd.http.loadlimits import ConcurrencyCap, ProbeCache
from jobsd.registry import Registry

pytestmark = pytest.mark.anyio

LONG_POLLS = 500
PROBES = 150
TOKENS = 20


def _registry() -> Registry:
    registry = Registry()

    @jobsd.handler("ok", registry=registry)
    async def ok(ctx: jobsd.JobContext) -> dict[str, bool]:
        return {"ok": True}

    return registry


@pytest.mark.timeout(60)
async def test_500_long_polls_and_a_probe_flood_leave_submissions_and_the_daemon_well(
    db_url: str,
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobsd.queues (name, paused_at) VALUES ('held', now())")
    tokens = [make_token(db_url, "acme", f"t{n}") for n in range(TOKENS)]
    settings = settings_for(db_url)
    # the long-polls would wait the whole 30 s: they are cut at the end of the test
    http = http_settings(longpoll_max=30.0, token_cache_s=1.0, probe_cache_s=1.0)
    codes: dict[str, list[int]] = {"poll": [], "probe": [], "submit": []}
    # no keep-alive: a connection uvicorn closes as idle (5 s) while httpx reuses it
    # would be a client-side ReadError, not an answer
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with (
        running_daemon(settings, _registry()) as daemon,
        served_api(settings, http, daemon=daemon) as (base, backend),
        httpx.AsyncClient(base_url=base, limits=limits, timeout=40.0) as client,
    ):
        held = await client.post(
            "/jobs", json={"type": "ok", "queue": "held"}, headers=bearer(tokens[0])
        )
        assert held.status_code == 202
        held_id = held.json()["id"]

        async def poll(n: int) -> None:
            r = await client.get(
                f"/jobs/{held_id}", params={"wait": 30}, headers=bearer(tokens[n % TOKENS])
            )
            codes["poll"].append(r.status_code)

        async def probe(n: int) -> None:
            path = ("/readyz", "/health", "/metrics")[n % 3]
            r = await client.get(path)
            codes["probe"].append(r.status_code)

        async with anyio.create_task_group() as polls:
            for n in range(LONG_POLLS):
                polls.start_soon(poll, n)

            # every long-poll either waits (admitted) or was refused with 429
            async def all_in() -> bool:
                return backend.longpolls.open + len(codes["poll"]) >= LONG_POLLS

            await wait_until(all_in, what="every long-poll admitted or refused", timeout_s=30)
            async with anyio.create_task_group() as probes:
                for n in range(PROBES):
                    probes.start_soon(probe, n)
            submitted = []
            for n in range(20):
                r = await client.post("/jobs", json={"type": "ok"}, headers=bearer(tokens[n]))
                codes["submit"].append(r.status_code)
                submitted.append(r.json()["id"])

            async def all_ran() -> bool:
                for job_id in submitted:
                    r = await client.get(f"/jobs/{job_id}", headers=bearer(tokens[0]))
                    if r.json().get("status") != "succeeded":
                        return False
                return True

            await wait_until(all_ran, what="the submitted jobs to run", timeout_s=20)
            ready = await client.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert daemon.listener.connected
            admitted = backend.longpolls.open
            backend.close_waits()  # the long-polls answer now, with the current state
    assert codes["submit"] == [202] * 20
    assert set(codes["probe"]) == {200}
    # 256 admitted in all (at most 32 per token), the rest refused at once
    assert admitted == http.longpoll_max_concurrent
    assert codes["poll"].count(429) == LONG_POLLS - admitted
    assert codes["poll"].count(200) == admitted
    # the probe flood asked the database a handful of times, not 150
    assert backend.probes.queries <= 12


def test_the_long_poll_cap_counts_in_all_and_per_key() -> None:
    cap = ConcurrencyCap(total=3, per_key=2)
    with cap.hold("a") as a1, cap.hold("a") as a2, cap.hold("a") as a3:
        assert (a1, a2, a3) == (True, True, False)
        with cap.hold("b") as b1, cap.hold("c") as c1:
            assert (b1, c1) == (True, False)
        assert cap.open == 2
    assert cap.open == 0
    with cap.hold("a") as again:
        assert again


async def test_the_probe_cache_asks_once_per_interval_and_shares_failures() -> None:
    now = [0.0]
    cache = ProbeCache(1.0, clock=lambda: now[0])
    calls = []

    async def query() -> int:
        calls.append(now[0])
        if len(calls) == 2:
            raise RuntimeError("down")
        return len(calls)

    assert [await cache.get("p", query) for _ in range(5)] == [1] * 5
    now[0] = 1.0
    for _ in range(3):
        with pytest.raises(RuntimeError, match="down"):
            await cache.get("p", query)
    now[0] = 2.5
    assert await cache.get("p", query) == 3
    assert cache.queries == 3
