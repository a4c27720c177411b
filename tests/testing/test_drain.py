"""``JobsdWorker.drain``: the test's jobs run through the daemon's claim, handler call
and outcome writes, in the test's process."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from support.history import assert_history_complete

import jobsd
from jobsd.errors import ConfigError
from jobsd.models import Job
from jobsd.registry import Registry
from jobsd.testing import DrainLimitExceeded, JobsdDB, JobsdWorker

pytestmark = pytest.mark.timeout(30)


def history(url: str, job_id: uuid.UUID) -> list[tuple[str | None, str, int, str | None]]:
    """Return a job's events as (from, to, attempt, reason), oldest first."""
    with psycopg.connect(url, autocommit=True) as conn:
        assert_history_complete(conn)
        rows = conn.execute(
            "SELECT from_status, to_status, attempt, reason FROM jobsd.all_job_events"
            " WHERE job_id = %s ORDER BY id",
            (job_id,),
        ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def test_a_job_runs_through_the_daemons_claim_and_outcome_write(
    worker: JobsdWorker, registry: Registry, jobsd_db: JobsdDB
) -> None:
    @jobsd.handler("greet", registry=registry)
    async def greet(ctx: jobsd.JobContext) -> dict[str, str]:
        await ctx.progress(done=1, total=1)
        return {"greeting": f"hello {ctx.payload['name']}"}

    job = jobsd.enqueue_sync("greet", {"name": "ada"}, org_id="acme")

    [ran] = worker.drain()

    assert (ran.id, ran.type, ran.status, ran.attempts) == (job.id, "greet", "succeeded", 1)
    assert ran.result == {"greeting": "hello ada"} and ran.error is None
    assert (ran.payload, ran.org_id, ran.queue) == ({"name": "ada"}, "acme", "default")
    assert ran.job.worker_id == worker.worker_id and ran.job.lease_id is not None
    assert ran.job.progress is not None and ran.job.progress["done"] == 1
    assert history(jobsd_db.url, job.id) == [
        (None, "queued", 0, None),
        ("queued", "running", 1, None),
        ("running", "succeeded", 1, None),
    ]
    assert worker.drain() == []  # nothing left


def test_a_failing_handler_is_retried_by_its_policy_then_fails_with_its_cause(
    worker: JobsdWorker, registry: Registry, jobsd_db: JobsdDB
) -> None:
    failed: list[Job] = []

    @jobsd.handler(
        "flaky",
        registry=registry,
        retry=jobsd.RetryPolicy(3, backoff=60, retry_on=(ConnectionError,)),
        on_fail=failed.append,
    )
    def flaky(ctx: jobsd.JobContext) -> None:
        raise ConnectionError(f"mail server down (attempt {ctx.attempt})")

    job = jobsd.enqueue_sync("flaky", org_id="acme")

    [first] = worker.drain()
    assert (first.status, first.attempts, first.reason) == ("scheduled", 1, "retry")
    assert first.error == "ConnectionError: mail server down (attempt 1)"
    assert first.job.run_after > datetime.now(UTC) + timedelta(seconds=30)
    assert worker.drain() == []  # the retry is not due for a minute

    [last] = worker.drain(include_scheduled=True)  # every retry, now

    assert (last.id, last.status, last.attempts) == (job.id, "failed", 3)
    assert last.error == "ConnectionError: mail server down (attempt 3)"
    assert last.result is not None
    cause = last.result["error"]
    assert cause["type"] == "builtins.ConnectionError" and "Traceback" in cause["traceback"]
    assert [f.id for f in failed] == [job.id]  # on_fail, once
    assert [(e[1], e[2], e[3]) for e in history(jobsd_db.url, job.id)] == [
        ("queued", 0, None),
        ("running", 1, None),
        ("scheduled", 1, "retry"),
        ("queued", 1, "due"),
        ("running", 2, None),
        ("scheduled", 2, "retry"),
        ("queued", 2, "due"),
        ("running", 3, None),
        ("failed", 3, "handler error"),
    ]


def test_an_unknown_type_fails_unless_left_queued(worker: JobsdWorker) -> None:
    job = jobsd.enqueue_sync("nobody_handles_this", org_id="acme")

    assert worker.drain(unknown_types="leave") == []
    [ran] = worker.drain()

    assert (ran.id, ran.status, ran.reason) == (job.id, "failed", "unknown type")
    assert ran.error == "unknown type 'nobody_handles_this': no handler registered"


def test_jobs_due_later_wait_unless_asked_for(worker: JobsdWorker, registry: Registry) -> None:
    @jobsd.handler("later", registry=registry)
    async def later(ctx: jobsd.JobContext) -> None:
        return None

    soon = jobsd.enqueue_sync("later", org_id="acme")
    tomorrow = jobsd.enqueue_sync(
        "later", org_id="acme", run_after=datetime.now(UTC) + timedelta(days=1)
    )

    assert [r.id for r in worker.drain()] == [soon.id]
    assert [(r.id, r.status) for r in worker.drain(include_scheduled=True)] == [
        (tomorrow.id, "succeeded")
    ]


def test_jobs_that_handlers_enqueue_run_in_the_same_drain_in_claim_order(
    worker: JobsdWorker, registry: Registry
) -> None:
    @jobsd.handler("order", registry=registry)
    async def order(ctx: jobsd.JobContext) -> None:
        await jobsd.enqueue("receipt", {"order": ctx.payload["n"]}, org_id=ctx.org_id)

    @jobsd.handler("receipt", registry=registry)
    def receipt(ctx: jobsd.JobContext) -> dict[str, Any]:
        return {"mailed": ctx.payload["order"]}

    jobsd.enqueue_sync("order", {"n": 1}, org_id="acme")
    jobsd.enqueue_sync("order", {"n": 2}, org_id="acme", priority=-1)  # runs first

    ran = worker.drain()

    assert [(r.type, r.status, r.payload) for r in ran] == [
        ("order", "succeeded", {"n": 2}),
        ("order", "succeeded", {"n": 1}),
        ("receipt", "succeeded", {"order": 2}),
        ("receipt", "succeeded", {"order": 1}),
    ]


def test_every_handler_runs_in_the_tests_process(worker: JobsdWorker, registry: Registry) -> None:
    """A type declared to run in a handler process runs here too: what the test patches,
    the handler sees."""
    seen: list[str] = []

    @jobsd.handler("isolated", registry=registry, isolation="process")
    def isolated(ctx: jobsd.JobContext) -> None:
        seen.append(threading.current_thread().name)

    jobsd.enqueue_sync("isolated", org_id="acme")

    [ran] = worker.drain()

    assert ran.status == "succeeded"
    assert seen == [f"job {ran.id}"]  # a thread of this process, named after the job


@pytest.mark.anyio
async def test_an_async_test_awaits_drain_async(worker: JobsdWorker, registry: Registry) -> None:
    @jobsd.handler("ping", registry=registry)
    async def ping(ctx: jobsd.JobContext) -> dict[str, bool]:
        return {"pong": True}

    job = await jobsd.enqueue("ping", org_id="acme")

    with pytest.raises(RuntimeError, match=r"await jobsd_worker.drain_async\(\)"):
        worker.drain()
    [ran] = await worker.drain_async()

    assert (ran.id, ran.status, ran.result) == (job.id, "succeeded", {"pong": True})


def test_a_drain_without_end_stops_at_max_jobs(worker: JobsdWorker, registry: Registry) -> None:
    @jobsd.handler("again", registry=registry)
    def again(ctx: jobsd.JobContext) -> None:
        jobsd.enqueue_sync("again", org_id=ctx.org_id)

    jobsd.enqueue_sync("again", org_id="acme")

    with pytest.raises(DrainLimitExceeded, match="drain ran 5 jobs and stopped"):
        worker.drain(max_jobs=5)


def test_handler_modules_are_imported_and_a_missing_one_named(jobsd_db: JobsdDB) -> None:
    with pytest.raises(ConfigError, match="cannot import handler module 'shop_jobs_missing'"):
        JobsdWorker(jobsd_db.url, modules=["shop_jobs_missing"])
