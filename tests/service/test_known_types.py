"""Workers take only the types they know (issue 14): two daemons with different handler
sets on one database each run only their own types; a job of a third type stays
queued and is reported (jobsd.workers.types, jobsd.unhandled_jobs()); with
JOBSD_UNKNOWN_TYPES=fail a daemon claims it and fails it ``unknown type``."""

from __future__ import annotations

import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.admin.queues import unhandled_jobs
from jobsd.registry import Registry

from .conftest import ADb, make_settings, running_daemon, wait_status, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def registry_of(*types: str) -> Registry:
    """A registry whose handlers report which type ran."""
    registry = Registry()
    for type_ in types:

        @jobsd.handler(type_, registry=registry)
        async def run(ctx: jobsd.JobContext) -> dict[str, str]:
            return {"ran": ctx.type}

    return registry


async def test_two_daemons_each_run_only_their_own_types(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    # the third type first: a daemon claiming in order would meet it first
    third = await client.enqueue("gamma", org_id="acme")
    alphas = [await client.enqueue("alpha", {"n": n}, org_id="acme") for n in range(3)]
    betas = [await client.enqueue("beta", {"n": n}, org_id="acme") for n in range(3)]
    one = make_settings(db_url, worker_id="one")
    two = make_settings(db_url, worker_id="two")
    async with (
        running_daemon(one, registry_of("alpha")),
        running_daemon(two, registry_of("beta")),
    ):
        for job in alphas + betas:
            await wait_status(db, job.id, "succeeded")
        # the daemons' rows say what they take
        cur = await db.execute("SELECT worker_id, types FROM jobsd.workers ORDER BY worker_id")
        assert [(r["worker_id"], r["types"]) for r in await cur.fetchall()] == [
            ("one", ["alpha"]),
            ("two", ["beta"]),
        ]
        # one more claim round each: gamma is still left alone
        await wait_until(lambda: _polled(db), what="a poll after the last job")
        assert await unhandled_jobs(db) == {"default": {"gamma": 1}}
    ran_by = {}
    for job in alphas + betas:
        cur = await db.execute("SELECT worker_id, report FROM jobsd.jobs WHERE id = %s", (job.id,))
        row = await cur.fetchone()
        assert row is not None
        ran_by[row["report"]["ran"]] = ran_by.get(row["report"]["ran"], set()) | {row["worker_id"]}
    assert ran_by == {"alpha": {"one"}, "beta": {"two"}}
    gamma = await client.get(third.id)
    assert (gamma.status, gamma.attempts, gamma.worker_id) == ("queued", 0, None)
    # no daemon at all: every queued job is unhandled
    assert await unhandled_jobs(db) == {"default": {"gamma": 1}}
    await assert_history_complete_async(db)


async def _polled(db: ADb) -> bool:
    # a poll tick is at most 1 s (0.5 s jittered): wait until both daemons had one
    # after the last job ended, by the database's clock
    cur = await db.execute(
        "SELECT now() - max(finished_at) > interval '1.2 seconds' AS ok FROM jobsd.jobs"
    )
    row = await cur.fetchone()
    return bool(row and row["ok"])


async def test_unknown_types_fail_restores_failing_them(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    job = await client.enqueue("gamma", org_id="acme")
    known = await client.enqueue("alpha", org_id="acme")
    settings = make_settings(db_url, worker_id="strict", unknown_types="fail")
    async with running_daemon(settings, registry_of("alpha")):
        row = await wait_status(db, job.id, "failed")
        await wait_status(db, known.id, "succeeded")
        cur = await db.execute("SELECT types FROM jobsd.workers WHERE worker_id = 'strict'")
        assert await cur.fetchone() == {"types": None}  # takes every type
        assert await unhandled_jobs(db) == {}
    assert row["reason"] == "unknown type"


async def test_the_daemon_records_its_types_rules(db_url: str, db: ADb) -> None:
    registry = registry_of("alpha")

    @jobsd.handler("charge", registry=registry, delivery="at_most_once")
    async def charge(ctx: jobsd.JobContext) -> None:
        return None

    async with running_daemon(make_settings(db_url), registry):
        cur = await db.execute(
            "SELECT type, delivery, max_attempts FROM jobsd.job_types ORDER BY 1"
        )
        rows = await cur.fetchall()
    assert [tuple(r.values()) for r in rows] == [
        ("alpha", "at_least_once", 1),
        ("charge", "at_most_once", 1),
    ]
