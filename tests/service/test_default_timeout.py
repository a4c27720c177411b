"""Nothing runs forever by default: a type that gives no timeout gets the daemon's
JOBSD_DEFAULT_TIMEOUT; ``timeout=None`` says no limit; the daemon says each type's
limit when it starts."""

from __future__ import annotations

import logging

import anyio
import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.registry import Registry
from jobsd.settings import Settings

from .conftest import ADb, fetch_job, make_settings, running_daemon, wait_status, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_a_hung_handler_with_no_timeout_ends_at_the_default_and_none_means_none(
    db_url: str,
    db: ADb,
    client: jobsd.Client,
    registry: Registry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = anyio.Event()

    @jobsd.handler("hangs", registry=registry)
    async def hangs(ctx: jobsd.JobContext) -> None:
        await anyio.sleep(3600)

    @jobsd.handler("unbounded", timeout=None, registry=registry)
    async def unbounded(ctx: jobsd.JobContext) -> None:
        await release.wait()

    @jobsd.handler("own", timeout=30, registry=registry)
    async def own(ctx: jobsd.JobContext) -> None:
        return None

    caplog.set_level(logging.INFO, logger="jobsd.worker.supervisor")
    async with running_daemon(make_settings(db_url, default_timeout=0.4), registry):
        hung = await client.enqueue("hangs", {}, org_id="acme")
        free = await client.enqueue("unbounded", {}, org_id="acme")
        row = await wait_status(db, hung.id, "failed", "succeeded")
        assert (row["status"], row["reason"], row["error"]) == (
            "failed",
            "timeout",
            "timeout after 0.4 s",
        )
        # the one that said timeout=None runs on, well past the default
        running = await fetch_job(db, free.id)

        async def past_the_default() -> bool:
            age = await db.execute(
                "SELECT now() - %s > interval '1.2 s' AS past", (running["started_at"],)
            )
            got = await age.fetchone()
            return bool(got and got["past"])

        await wait_until(past_the_default, what="three times the default timeout")
        assert (await fetch_job(db, free.id))["status"] == "running"
        release.set()
        assert (await wait_status(db, free.id, "succeeded", "failed"))["status"] == "succeeded"
    said = [r for r in caplog.records if r.getMessage() == "daemon.timeouts"]
    assert [getattr(r, "timeouts", None) for r in said] == [
        {"hangs": 0.4, "own": 30, "unbounded": None}
    ]
    await assert_history_complete_async(db)


def test_jobsd_default_timeout_is_an_hour_and_none_turns_it_off() -> None:
    assert Settings(database_url="x").default_timeout == 3600.0
    assert Settings(database_url="x", default_timeout="10m").default_timeout == 600.0
    assert Settings(database_url="x", default_timeout="none").default_timeout is None
