"""Dedup scopes with a real daemon: the A/B lost-wake-up scenario and scope 'active'."""

from __future__ import annotations

import anyio
import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.registry import Registry

from .conftest import ADb, events_of, fetch_job, make_settings, running_daemon, wait_status

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_scope_queue_accepts_a_new_job_while_the_first_runs_and_runs_it_after(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    trace: list[str] = []
    release = anyio.Event()

    @jobsd.handler("reconcile", dedup_scope="queue", registry=registry)
    async def reconcile(ctx: jobsd.JobContext) -> dict[str, int]:
        trace.append(f"start {ctx.payload['n']}")
        if ctx.payload["n"] == 1:
            await release.wait()
        trace.append(f"end {ctx.payload['n']}")
        return {"n": ctx.payload["n"]}

    first = await client.enqueue("reconcile", {"n": 1}, org_id="acme", dedup_key="map:7")
    # still queued: the key is held, a second enqueue returns the same job
    again = await client.enqueue("reconcile", {"n": 99}, org_id="acme", dedup_key="map:7")
    assert again.id == first.id

    # one slot: B can only run after A, as in seed 000 (one job at a time)
    async with running_daemon(make_settings(db_url, slots=1), registry):
        running = await wait_status(db, first.id, "running")
        assert running["dedup_key"] is None, "scope 'queue' releases the key when the run starts"

        # A is running; a change arrives (B): it must be accepted as a new job
        second = await client.enqueue("reconcile", {"n": 2}, org_id="acme", dedup_key="map:7")
        assert second.id != first.id
        assert second.status == "queued"
        assert (await fetch_job(db, second.id))["status"] == "queued"
        # and a third enqueue while B waits is folded into B
        third = await client.enqueue("reconcile", {"n": 3}, org_id="acme", dedup_key="map:7")
        assert third.id == second.id

        release.set()
        done_b = await wait_status(db, second.id, "succeeded", "failed")

    done_a = await fetch_job(db, first.id)
    assert done_a["status"] == "succeeded"
    assert done_b["status"] == "succeeded"
    assert done_b["report"] == {"n": 2}
    # B ran, and only after A's handler returned (its slot frees before A's row is written)
    assert trace == ["start 1", "end 1", "start 2", "end 2"]
    assert done_b["started_at"] > done_a["started_at"]
    assert done_b["dedup_key"] is None
    await assert_history_complete_async(db)


async def test_scope_active_refuses_while_running_and_accepts_after(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    release = anyio.Event()
    runs: list[str] = []

    @jobsd.handler("crawl", dedup_scope="active", registry=registry)
    async def crawl(ctx: jobsd.JobContext) -> None:
        runs.append(str(ctx.id))
        if ctx.payload.get("block"):
            await release.wait()

    first = await client.enqueue("crawl", {"block": True}, org_id="acme", dedup_key="crawl:site1")
    async with running_daemon(make_settings(db_url, slots=4), registry):
        running = await wait_status(db, first.id, "running")
        assert running["dedup_key"] == "crawl:site1", "scope 'active' holds the key while running"

        # free slots are waiting, yet the same work is not started twice
        again = await client.enqueue("crawl", {}, org_id="acme", dedup_key="crawl:site1")
        assert again.id == first.id
        assert again.status == "running"
        # another tenant's identical key is its own job
        other_org = await client.enqueue("crawl", {}, org_id="globex", dedup_key="crawl:site1")
        assert other_org.id != first.id

        release.set()
        ended = await wait_status(db, first.id, "succeeded", "failed")
        assert ended["status"] == "succeeded"
        assert ended["dedup_key"] is None

        after = await client.enqueue("crawl", {}, org_id="acme", dedup_key="crawl:site1")
        assert after.id != first.id
        assert (await wait_status(db, after.id, "succeeded", "failed"))["status"] == "succeeded"
        await wait_status(db, other_org.id, "succeeded", "failed")

    assert sorted(runs) == sorted(str(i) for i in (first.id, other_org.id, after.id))
    assert await events_of(db, first.id) == [
        (None, "queued", 0, None),
        ("queued", "running", 1, None),
        ("running", "succeeded", 1, None),
    ]
    await assert_history_complete_async(db)
