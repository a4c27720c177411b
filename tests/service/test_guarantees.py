"""The handlers' guarantees (issue 11): on_fail after every move to failed, stalls, the
recover hook at every ambiguous end of an at_most_once job, progress caps."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from support.jobs import make_job

import jobsd
from jobsd.models import Job
from jobsd.registry import Registry
from jobsd.store import queries

from .conftest import ADb, make_settings, running_daemon, wait_status, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def test_on_fail_runs_once_for_a_cascade_and_a_resolve_failed(
    db_url: str, db: ADb, conn: psycopg.Connection[Any], client: jobsd.Client, registry: Registry
) -> None:
    hooked: list[uuid.UUID] = []

    def on_fail(job: Job) -> None:
        hooked.append(job.id)

    @jobsd.handler("parent", on_fail=on_fail, registry=registry)
    async def parent(ctx: jobsd.JobContext) -> None:
        raise RuntimeError("the parent fails")

    @jobsd.handler("child", on_fail=on_fail, registry=registry)
    async def child(ctx: jobsd.JobContext) -> None:
        raise AssertionError("never runs: its dependency failed")

    settings = make_settings(db_url, death_check_interval=0.3)
    async with running_daemon(settings, registry) as daemon:
        up = await client.enqueue("parent", {}, org_id="acme")
        down = await client.enqueue("child", {}, org_id="acme", depends_on=[up.id])
        row = await wait_status(db, down.id, "failed")

        async def both() -> bool:
            return sorted(hooked) == sorted([up.id, down.id])

        await wait_until(both, what="on_fail of the parent and of its cascaded dependent")
        # an operator's resolve --failed, in another process: found by the next pass
        lost = make_job(conn, status="recovery_required", type="child", org_id="acme")
        await queries.resolve_job(db, lost, status="failed", reason="resolved", actor="op")

        async def three() -> bool:
            return lost in hooked

        await wait_until(three, what="on_fail after jobsd resolve --failed")
        calls = daemon.hooks.calls

    assert row["reason"] == f"dependency {up.id} failed"
    assert sorted(hooked) == sorted([up.id, down.id, lost]), "once per failure"
    assert calls == 3
