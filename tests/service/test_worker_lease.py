"""A daemon counts as dead only when its lock is free and its lease has run out; one
that cannot renew its lease stops its runs (the fence) before the lease ends."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import anyio
import psycopg
import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.errors import BackendUnavailable
from jobsd.registry import Registry
from jobsd.store.db import AsyncConn
from jobsd.worker.supervisor import Daemon

from .conftest import ADb, events_of, fetch_job, make_settings, running_daemon, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@dataclass
class Runs:
    """Every handler run: (job id, attempt, start, end or None), on the monotonic clock."""

    spans: list[list[object]] = field(default_factory=list)

    def start(self, ctx: jobsd.JobContext) -> list[object]:
        span: list[object] = [str(ctx.id), ctx.attempt, time.monotonic(), None]
        self.spans.append(span)
        return span

    def overlaps(self) -> list[str]:
        found = []
        for i, a in enumerate(self.spans):
            for b in self.spans[i + 1 :]:
                if a[0] != b[0]:
                    continue
                a_end = a[3] if a[3] is not None else float("inf")
                b_end = b[3] if b[3] is not None else float("inf")
                if a[2] < b_end and b[2] < a_end:  # type: ignore[operator]
                    found.append(f"{a[0]}: attempts {a[1]} and {b[1]} overlap")
        return found


def register(registry: Registry, runs: Runs, *, long_s: float) -> None:
    """``long`` and ``once`` run ``long_s`` at their first attempt, return at once after."""

    async def run(ctx: jobsd.JobContext) -> None:
        span = runs.start(ctx)
        try:
            if ctx.attempt == 1:
                await anyio.sleep(long_s)
        finally:
            span[3] = time.monotonic()

    jobsd.handler("long", max_attempts=2, registry=registry)(run)
    jobsd.handler("once", delivery="at_most_once", registry=registry)(run)


async def kill_lifeline(db: ADb, worker_id: str) -> int:
    """Terminate the backend holding ``worker_id``'s lock; return how many were."""
    cur = await db.execute(
        "SELECT count(pg_terminate_backend(l.pid)) AS n FROM pg_locks AS l "
        "WHERE l.locktype = 'advisory' AND l.granted "
        "AND ((l.classid::bigint << 32) | l.objid::bigint) = jobsd.worker_lock_key(%s)",
        (worker_id,),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def running_on(db: ADb, job_id: object, worker_id: str) -> bool:
    row = await fetch_job(db, job_id)
    return row["status"] == "running" and row["worker_id"] == worker_id


async def test_a_live_daemon_whose_lock_connection_is_killed_keeps_its_jobs(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    runs = Runs()
    register(registry, runs, long_s=1.5)
    owner_settings = make_settings(db_url, worker_id="owner", death_check_interval=0.1)
    rival_settings = make_settings(db_url, worker_id="rival", death_check_interval=0.1)
    async with running_daemon(owner_settings, registry) as owner:
        jobs = [await client.enqueue(t, {}, org_id="acme") for t in ("long", "once")]
        for job in jobs:
            await wait_until(
                lambda job=job: running_on(db, job.id, "owner"), what="the owner's runs"
            )
        async with running_daemon(rival_settings, registry) as rival:
            for kill in range(3):
                assert await kill_lifeline(db, "owner") == 1
                await wait_until(
                    lambda kill=kill: _true(owner.lifeline.registrations == kill + 2),
                    what="the owner to take its lock again",
                )
            for job in jobs:
                row = await wait_until(lambda job=job: _done(db, job.id), what="the runs to end")
                assert (row["status"], row["attempts"]) == ("succeeded", 1)
            assert rival.stats.swept == {}, "a live daemon was declared dead"
            assert owner.fence.closings == 0
    assert runs.overlaps() == []
    assert len(runs.spans) == 2
    await assert_history_complete_async(db)


async def _true(value: bool) -> bool:
    return value


async def _done(db: ADb, job_id: object) -> dict[str, object] | None:
    row = await fetch_job(db, job_id)
    return row if row["status"] in ("succeeded", "failed", "cancelled") else None


async def _unreachable() -> AsyncConn:
    raise BackendUnavailable("lifeline cut off (test)")


async def test_a_daemon_that_cannot_renew_its_lease_stops_its_runs_before_a_rescue(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    runs = Runs()
    register(registry, runs, long_s=30)
    owner_settings = make_settings(
        db_url, worker_id="owner", death_check_interval=0.1, worker_lease=1.5
    )
    rival_settings = make_settings(db_url, worker_id="rival", death_check_interval=0.1)
    async with running_daemon(owner_settings, registry) as owner:
        jobs = {t: await client.enqueue(t, {}, org_id="acme") for t in ("long", "once")}
        for job in jobs.values():
            await wait_until(
                lambda job=job: running_on(db, job.id, "owner"), what="the owner's runs"
            )
        async with running_daemon(rival_settings, registry) as rival:
            # the owner can no longer reach its lock or renew its lease; its pool still can
            owner.lifeline.connect = _unreachable
            assert await kill_lifeline(db, "owner") == 1
            again = await wait_until(lambda: _done(db, jobs["long"].id), what="the rerun")
            once = await wait_until(lambda: _done(db, jobs["once"].id), what="the failure")
            assert owner.fence.closings == 1
            assert not owner.fence.open
            # the owner is dead to the others once its lease is over
            await wait_until(lambda: _true(rival.stats.deaths >= 1), what="the owner's death")
    assert (again["status"], again["attempts"]) == ("succeeded", 2)
    assert (await events_of(db, jobs["long"].id))[2] == ("running", "queued", 1, "fenced")
    assert (once["status"], once["reason"], once["attempts"]) == ("failed", "fenced", 1)
    assert str(once["error"]).startswith("fenced: the daemon could not renew its lease")
    assert runs.overlaps() == []
    assert [(s[0], s[1]) for s in runs.spans].count((str(jobs["once"].id), 1)) == 1
    await assert_history_complete_async(db)


async def test_a_handler_that_outlives_the_lease_ends_the_daemon(
    db_url: str, db: ADb, client: jobsd.Client, registry: Registry
) -> None:
    release = threading.Event()

    @jobsd.handler("stubborn", registry=registry, timeout=None)
    def stubborn(ctx: jobsd.JobContext) -> None:
        release.wait(20)  # ignores ctx.cancelled

    breaches: list[float] = []
    settings = make_settings(db_url, death_check_interval=0.1, worker_lease=1.5)
    daemon: Daemon
    async with running_daemon(
        settings, registry, on_fence_breach=lambda: breaches.append(time.monotonic())
    ) as daemon:
        job = await client.enqueue("stubborn", {}, org_id="acme")
        await wait_until(lambda: running_on(db, job.id, settings.worker_id), what="the run")
        daemon.lifeline.connect = _unreachable
        cut = time.monotonic()
        assert await kill_lifeline(db, settings.worker_id) == 1
        await wait_until(lambda: _true(bool(breaches)), what="the breach")
        # before the lease could end: it was last renewed before the cut
        assert breaches[0] - cut < 1.5
        release.set()


async def test_a_lock_session_the_server_kept_after_a_cut_is_ended_by_its_daemon(
    db_url: str, db: ADb, registry: Registry
) -> None:
    settings = make_settings(db_url, death_check_interval=0.1, worker_lease=10)
    async with running_daemon(settings, registry) as daemon:
        # the daemon's lock session as a cut leaves it: alive on the server, unreachable
        # for the daemon (here: a session of its own name holding its lock)
        ghost = await psycopg.AsyncConnection.connect(
            db_url, autocommit=True, application_name="jobsd-lifeline"
        )
        gate = anyio.Event()
        connect = daemon.lifeline.connect

        async def after_the_ghost() -> AsyncConn:
            await gate.wait()
            return await connect()

        daemon.lifeline.connect = after_the_ghost
        try:
            assert await kill_lifeline(db, settings.worker_id) == 1

            async def ghost_holds_the_lock() -> int | None:
                cur = await ghost.execute(
                    "SELECT pg_try_advisory_lock(jobsd.worker_lock_key(%s)) AS locked, "
                    "pg_backend_pid() AS pid",
                    (settings.worker_id,),
                )
                row = await cur.fetchone()
                return row[1] if row is not None and row[0] else None

            # the server lets go of the killed session's lock a moment later
            ghost_pid = await wait_until(ghost_holds_the_lock, what="the ghost's lock")
            daemon.lifeline._session_pid = ghost_pid  # the session it had, as it knew it
            gate.set()

            async def registered_again() -> bool:
                return daemon.lifeline.registrations == 2 and daemon.lifeline.registered

            await wait_until(registered_again, what="the lock taken back", timeout_s=10)
            assert daemon.fence.closings == 0
            with pytest.raises(psycopg.OperationalError):
                await ghost.execute("SELECT 1")
        finally:
            await ghost.close()
