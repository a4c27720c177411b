"""Scheduled jobs start when due, not before, and not a poll interval late."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.registry import Registry

from .conftest import ADb, events_of, make_settings, running_daemon, wait_status

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

# far longer than the test may take: only the due time can start the job on time
POLL_S = 30.0
LATE_S = 0.5


async def run_scheduled(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry, *, enqueue_first: bool
) -> None:
    starts: list[datetime] = []

    @jobsd.handler("report", registry=registry)
    async def report(ctx: jobsd.JobContext) -> None:
        starts.append(datetime.now(UTC))

    settings = make_settings(db_url, poll_interval=POLL_S)
    due = datetime.now(UTC) + timedelta(seconds=1.5)
    if enqueue_first:
        job = await client.enqueue("report", {}, org_id="acme", run_after=due)
    async with running_daemon(settings, registry):
        if not enqueue_first:
            # a first job run to its end: the start-up rounds are over, the claimer idles
            warm_up = await client.enqueue("report", {}, org_id="acme")
            await wait_status(db, warm_up.id, "succeeded")
            starts.clear()
            due = datetime.now(UTC) + timedelta(seconds=1.0)
            job = await client.enqueue("report", {}, org_id="acme", run_after=due)
        assert job.status == "scheduled"
        row = await wait_status(db, job.id, "succeeded", "failed", timeout_s=due_in(due) + 2)

    assert row["status"] == "succeeded"
    assert len(starts) == 1
    assert starts[0] >= due, "started before it was due"
    assert row["started_at"] >= due
    late = (starts[0] - due).total_seconds()
    assert late < LATE_S, f"started {late:.2f} s after it was due"
    assert await events_of(db, job.id) == [
        (None, "scheduled", 0, None),
        ("scheduled", "queued", 0, "due"),
        ("queued", "running", 1, None),
        ("running", "succeeded", 1, None),
    ]
    await assert_history_complete_async(db)


def due_in(due: datetime) -> float:
    """Return the seconds until ``due``."""
    return max((due - datetime.now(UTC)).total_seconds(), 0.0)


async def test_a_job_scheduled_before_start_runs_when_due(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    await run_scheduled(db_url, db, client, registry, enqueue_first=True)


async def test_a_job_scheduled_while_the_daemon_idles_runs_when_due(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    await run_scheduled(db_url, db, client, registry, enqueue_first=False)
