"""GET /jobs/{id}?wait=S: woken by the database's notification, not by a sleep loop."""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx
import psycopg
import pytest
from apikit import Api, bearer, http_settings, running_api, settings_for, wait_until

pytestmark = pytest.mark.anyio


async def _waiting(api: Api, count: int = 1) -> bool:
    return api.backend.waiter.waiting >= count


async def long_poll(
    api: Api, token: str, job_id: str, wait: float, out: list[Any], answered: anyio.Event
) -> None:
    """GET the job with ``?wait=``; keep the answer in ``out`` and set ``answered``."""
    with anyio.fail_after(wait + 2):
        r = await api.client.get(f"/jobs/{job_id}", params={"wait": wait}, headers=bearer(token))
    out.append(r)
    answered.set()


async def test_wait_answers_when_another_request_cancels(db_url: str, token_a: str) -> None:
    async with running_api(settings_for(db_url)) as api:
        await api.until_listening()
        job_id = (
            await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token_a))
        ).json()["id"]
        out: list[httpx.Response] = []
        answered = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(long_poll, api, token_a, job_id, 20.0, out, answered)
            await wait_until(lambda: _waiting(api), what="the long-poll to register")
            # the cancel wakes the waiting request: it answers within 1 s
            with anyio.fail_after(1.0):
                r = await api.client.post(f"/jobs/{job_id}/cancel", headers=bearer(token_a))
                assert r.status_code == 200
                await answered.wait()
        (answer,) = out
        assert answer.status_code == 200
        assert answer.json()["status"] == "cancelled"
        assert [h["to"] for h in answer.json()["history"]] == ["queued", "cancelled"]
        assert api.backend.waiter.waiting == 0


async def test_wait_answers_when_a_worker_finishes_the_job(db_url: str, token_a: str) -> None:
    """Any writer that makes the job terminal wakes the request (here plain SQL)."""
    async with running_api(settings_for(db_url)) as api:
        await api.until_listening()
        job_id = (
            await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token_a))
        ).json()["id"]
        out: list[httpx.Response] = []
        answered = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(long_poll, api, token_a, job_id, 20.0, out, answered)
            await wait_until(lambda: _waiting(api), what="the long-poll to register")
            with psycopg.connect(db_url, autocommit=True) as conn:
                # a non-terminal change does not end the wait
                conn.execute(
                    "UPDATE jobsd.jobs SET status = 'running', started_at = now(), attempts = 1 "
                    "WHERE id = %s",
                    (job_id,),
                )
                await anyio.sleep(0.2)
                assert not out
                # the terminal change wakes the request: it answers within 1 s
                with anyio.fail_after(1.0):
                    conn.execute(
                        "UPDATE jobsd.jobs SET status = 'succeeded', finished_at = now(), "
                        "report = '{\"rows\": 3}' WHERE id = %s",
                        (job_id,),
                    )
                    await answered.wait()
        (answer,) = out
        assert answer.json()["status"] == "succeeded"
        assert answer.json()["report"] == {"rows": 3}


async def test_wait_ends_at_its_deadline_and_is_capped(db_url: str, token_a: str) -> None:
    async with running_api(settings_for(db_url), http_settings(longpoll_max=0.4)) as api:
        job_id = (
            await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token_a))
        ).json()["id"]
        started = time.monotonic()
        r = await api.client.get(f"/jobs/{job_id}?wait=0.2", headers=bearer(token_a))
        took = time.monotonic() - started
        assert r.status_code == 200 and r.json()["status"] == "queued"
        assert 0.2 <= took < 1.0
        started = time.monotonic()
        r = await api.client.get(f"/jobs/{job_id}?wait=3600", headers=bearer(token_a))
        took = time.monotonic() - started
        assert r.json()["status"] == "queued"
        assert 0.4 <= took < 1.5
        for bad in ("-1", "nan", "inf", "soon"):
            r = await api.client.get(f"/jobs/{job_id}?wait={bad}", headers=bearer(token_a))
            assert r.status_code == 422, bad


async def test_a_notification_lost_during_a_reconnect_is_made_up_by_a_reread(
    db_url: str, token_a: str
) -> None:
    """The job finishes while the LISTEN connection is being killed: the re-read after the
    reconnect still answers the waiting request at once.

    On a loaded machine the killed backend may still deliver the notification before it
    dies; the scenario is then played again (every answer is checked each time) until
    the kill comes first, as it does almost always."""
    async with running_api(settings_for(db_url)) as api:
        waiter = api.backend.waiter
        lost = 0
        for _attempt in range(5):
            await api.until_listening()
            reconnects, notifications = waiter.reconnects, waiter.notifications
            job_id = (
                await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token_a))
            ).json()["id"]
            out: list[httpx.Response] = []
            answered = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(long_poll, api, token_a, job_id, 20.0, out, answered)
                await wait_until(lambda: _waiting(api), what="the long-poll to register")
                # answered within 3 s of the change, through the reconnect
                with anyio.fail_after(3.0):
                    with psycopg.connect(db_url, autocommit=True) as conn, conn.transaction():
                        conn.execute(
                            "UPDATE jobsd.jobs SET status = 'cancelled', finished_at = now() "
                            "WHERE id = %s",
                            (job_id,),
                        )
                        conn.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name = 'jobsd-api-listen' "
                            "AND datname = current_database()"
                        )
                    await answered.wait()
            (answer,) = out
            assert answer.json()["status"] == "cancelled"

            async def reconnected(before: int = reconnects) -> bool:
                return waiter.reconnects == before + 1 and waiter.connected

            await wait_until(reconnected, what="the LISTEN connection back")
            if waiter.notifications == notifications:
                # the notification went to the killed connection: the re-read answered
                lost += 1
                break
        assert lost == 1
