"""Poison is not an outage (issue 12): one bad job never wedges the daemon for the others.

A 10,000-job dependency chain cancelled at its head ends in one statement; an outcome
the database refuses fails its own job with a cause while its batch-mates are written.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from support.daemon import running_daemon

import jobsd
from jobsd.errors import DatabaseError
from jobsd.ops import Caller
from jobsd.ops.cancel import cancel_job
from jobsd.registry import Registry
from jobsd.store import queries
from jobsd.store.db import AsyncPool
from jobsd.worker.clock import ManualClock
from jobsd.worker.completer import Completer, CompleterSettings
from jobsd.worker.executor import JobRunner, RunnerSettings, make_context
from jobsd.worker.heartbeat import Heartbeat, HeartbeatSettings
from jobsd.worker.holdings import Holdings
from jobsd.worker.stats import DaemonStats
from jobsd.worker.sweeper import SweepCounts, Sweeper, SweeperSettings
from jobsd.worker.waker import Waker

from .conftest import ADb, fetch_job, make_settings, wait_status

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

WORKER = "test-host:1:poison"
CHAIN = 10_000


def _sweeper_settings() -> SweeperSettings:
    """Return a sweeper's settings: stale after 10 minutes, one attempt by default."""
    return SweeperSettings(
        worker_id=WORKER,
        death_check_interval_s=5.0,
        sweep_interval_s=60.0,
        stale_after_s=600.0,
        default_max_attempts=1,
    )


def _make_chain(conn: psycopg.Connection[object], length: int) -> uuid.UUID:
    """Insert a chain: a queued head, then ``length - 1`` blocked jobs, each on the one
    before; return the head's id. Raw SQL: 10,000 enqueues one by one would be slow."""
    conn.execute(
        "CREATE TEMP TABLE chain AS SELECT i, gen_random_uuid() AS id "
        "FROM generate_series(0, %s - 1) AS i",
        (length,),
    )
    conn.execute(
        "INSERT INTO jobsd.jobs (id, org_id, type, status, has_dependents) "
        "SELECT id, 'acme', 'link', CASE WHEN i = 0 THEN 'queued' ELSE 'blocked' END, "
        "i < %s - 1 FROM chain ORDER BY i",
        (length,),
    )
    conn.execute(
        "INSERT INTO jobsd.job_dependencies (job_id, depends_on, org_id) "
        "SELECT c.id, p.id, 'acme' FROM chain AS c JOIN chain AS p ON p.i = c.i - 1"
    )
    row = conn.execute("SELECT id FROM chain WHERE i = 0").fetchone()
    assert row is not None
    head = row[0]
    assert isinstance(head, uuid.UUID)
    return head


@pytest.mark.heavy
async def test_cancelling_the_head_of_a_10000_chain_ends_it_and_others_still_run(
    db_url: str, conn: psycopg.Connection[object], db: ADb, registry: Registry
) -> None:
    head = _make_chain(conn, CHAIN)

    @jobsd.handler("other", registry=registry)
    async def other(ctx: jobsd.JobContext) -> dict[str, bool]:
        return {"ran": True}

    async with running_daemon(make_settings(db_url), registry) as daemon:
        done = await cancel_job(db, Caller.as_operator("op"), head, reason="cancelled by operator")
        assert done.action == "cancelled"
        async with jobsd.Client(db_url) as client:
            unrelated = await client.enqueue("other", org_id="acme")
        row = await wait_status(db, unrelated.id, "succeeded")
        assert row["report"] == {"ran": True}
        assert daemon is not None
    counts = conn.execute(
        "SELECT status, count(*) FROM jobsd.jobs WHERE type = 'link' GROUP BY status"
    ).fetchall()
    assert sorted(counts) == [("cancelled", 1), ("failed", CHAIN - 1)]
    # every job of the chain names the dependency that ended before it
    wrong = conn.execute(
        "SELECT count(*) FROM chain AS c JOIN chain AS p ON p.i = c.i - 1 "
        "JOIN jobsd.jobs AS j ON j.id = c.id "
        "WHERE j.reason IS DISTINCT FROM format('dependency %s %s', p.id, "
        "CASE WHEN p.i = 0 THEN 'cancelled' ELSE 'failed' END)"
    ).fetchone()
    assert wrong == (0,)
    events = conn.execute(
        "SELECT count(*) FROM jobsd.all_job_events AS e JOIN chain AS c ON c.id = e.job_id "
        "WHERE e.to_status IN ('failed', 'cancelled')"
    ).fetchone()
    assert events == (CHAIN,)


async def test_a_failed_head_fails_a_diamond_once_per_job(
    conn: psycopg.Connection[object], db: ADb
) -> None:
    # 30 layers of 2 jobs, each depending on both of the layer before: 2**30 paths,
    # 60 jobs; the closure visits each job once
    conn.execute("CREATE TEMP TABLE lattice (layer int, k int, id uuid)")
    conn.execute(
        "INSERT INTO lattice SELECT l, k, gen_random_uuid() "
        "FROM generate_series(1, 30) AS l, generate_series(0, 1) AS k"
    )
    head = uuid.uuid4()
    conn.execute(
        "INSERT INTO jobsd.jobs (id, org_id, type, status, has_dependents) "
        "VALUES (%s, 'acme', 'root', 'queued', true)",
        (head,),
    )
    conn.execute(
        "INSERT INTO jobsd.jobs (id, org_id, type, status, has_dependents) "
        "SELECT id, 'acme', 'node', 'blocked', layer < 30 FROM lattice"
    )
    conn.execute(
        "INSERT INTO jobsd.job_dependencies (job_id, depends_on, org_id) "
        "SELECT id, %s, 'acme' FROM lattice WHERE layer = 1 "
        "UNION ALL SELECT c.id, p.id, 'acme' FROM lattice AS c "
        "JOIN lattice AS p ON p.layer = c.layer - 1",
        (head,),
    )
    await cancel_job(db, Caller.as_operator("op"), head, reason="stop")
    assert conn.execute(
        "SELECT status, count(*) FROM jobsd.jobs WHERE type = 'node' GROUP BY status"
    ).fetchall() == [("failed", 60)]
    assert conn.execute(
        "SELECT count(*) FROM jobsd.all_job_events AS e JOIN lattice AS l ON l.id = e.job_id "
        "WHERE e.to_status = 'failed'"
    ).fetchone() == (60,)


async def test_an_outcome_too_large_fails_its_job_and_its_batch_mates_are_written(
    pool: AsyncPool, db_url: str, db: ADb, registry: Registry
) -> None:
    @jobsd.handler("ok", registry=registry)
    async def ok(ctx: jobsd.JobContext) -> dict[str, int]:
        return {"n": 1}

    @jobsd.handler("huge", registry=registry)
    async def huge(ctx: jobsd.JobContext) -> dict[str, str]:
        return {"blob": "x" * 1_100_000}  # over the report's 1 MiB in the database

    async with jobsd.Client(db_url) as client:
        jobs = [await client.enqueue(t, org_id="acme") for t in ("ok", "huge", "ok", "ok")]
    async with pool.connection() as c:
        claimed = await queries.claim_batch(
            c, limit=4, worker_id=WORKER, queues=None, keep_dedup_types=[]
        )
    assert len(claimed) == 4
    clock = ManualClock()
    holdings = Holdings(4, clock)
    failed: list[uuid.UUID] = []
    completer = Completer(
        pool,
        CompleterSettings(worker_id=WORKER),
        clock,
        holdings,
        DaemonStats(),
        Waker(),
        lambda job: failed.append(job.id),
    )
    runner = JobRunner(
        RunnerSettings(grace_s=1.0), clock, registry, holdings, DaemonStats(), completer.submit
    )
    for job in claimed:
        await runner.run_once(job)
    assert completer.pending == 4
    # one pass settles the whole batch: the three good outcomes and the refused one
    assert await completer.run_once() == 4
    assert completer.pending == 0 and len(holdings) == 0
    rows = {j.id: await fetch_job(db, j.id) for j in jobs}
    assert [rows[j.id]["status"] for j in jobs] == ["succeeded", "failed", "succeeded", "succeeded"]
    bad = rows[jobs[1].id]
    assert bad["reason"] == "result rejected"
    assert "could not be stored" in bad["error"]
    assert "jobs_report_size" in bad["error"]
    assert failed == [jobs[1].id]


async def test_a_progress_too_large_is_dropped_and_every_job_stays_held(
    pool: AsyncPool, db_url: str, db: ADb
) -> None:
    async with jobsd.Client(db_url) as client:
        jobs = [await client.enqueue("t", org_id="acme") for _ in range(3)]
    async with pool.connection() as c:
        claimed = await queries.claim_batch(
            c, limit=3, worker_id=WORKER, queues=None, keep_dedup_types=[]
        )
    clock = ManualClock()
    holdings = Holdings(3, clock)
    held = [holdings.add(job, make_context(job)) for job in claimed]
    heartbeat = Heartbeat(pool, HeartbeatSettings(tick_s=1.0, beat_s=10.0), clock, holdings)
    await held[0].ctx.progress(done=1)
    await held[1].ctx.progress(blob="x" * 1_100_000)  # over the database's 1 MiB
    await held[2].ctx.progress(done=3)
    assert await heartbeat.run_once(force=True) == 3
    rows = {j.id: await fetch_job(db, j.id) for j in jobs}
    by_held = [rows[h.job.id]["progress"] for h in held]
    assert by_held[0]["done"] == 1 and by_held[2]["done"] == 3
    # the refused progress is dropped: nothing of it written, the job still checked
    assert by_held[1] is None
    assert not any(h.lost for h in held)


async def test_a_stale_job_the_database_refuses_to_rescue_fails_alone(
    pool: AsyncPool, db_url: str, db: ADb, registry: Registry
) -> None:
    @jobsd.handler("t", max_attempts=3, registry=registry)
    async def t(ctx: jobsd.JobContext) -> None:
        return None

    async with jobsd.Client(db_url) as client:
        jobs = [await client.enqueue("t", org_id="acme") for _ in range(3)]
    await db.execute(
        "UPDATE jobsd.jobs SET status = 'running', attempts = 1, lease_id = gen_random_uuid(),"
        " worker_id = 'gone:1:x', started_at = now() - interval '1 h'"
    )
    poisoned = jobs[1].id
    # the database refuses to requeue that one job, whatever the retries: a program limit
    await db.execute(
        "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'too much' USING ERRCODE = 'program_limit_exceeded'; END $$"
    )
    await db.execute(
        "CREATE TRIGGER refuse BEFORE UPDATE OF status ON jobsd.jobs FOR EACH ROW "
        f"WHEN (NEW.status = 'queued' AND NEW.id = '{poisoned}') "
        "EXECUTE FUNCTION public.refuse()"
    )
    cfg = _sweeper_settings()
    failed: list[uuid.UUID] = []
    sweeper = Sweeper(
        pool, cfg, ManualClock(), registry, DaemonStats(), lambda job: failed.append(job.id)
    )
    assert await sweeper.sweep_stale() == {"queued": 2, "failed": 1}
    rows = [await fetch_job(db, j.id) for j in jobs]
    assert [r["status"] for r in rows] == ["queued", "failed", "queued"]
    assert rows[1]["reason"] == "rescue rejected"
    assert rows[1]["error"].startswith("rescue failed: too much")
    assert failed == [poisoned]
    assert await sweeper.sweep_stale() == {}  # nothing left: no loop


async def test_a_pass_refused_as_a_whole_is_logged_and_tried_at_the_next_interval(
    pool: AsyncPool, registry: Registry
) -> None:
    cfg = _sweeper_settings()
    stats = DaemonStats()
    sweeper = Sweeper(pool, cfg, ManualClock(), registry, stats, lambda job: None)

    async def refused() -> SweepCounts:
        raise DatabaseError("sweep failed: too much")

    guarded = sweeper._survive(refused)
    assert await guarded() == {}
    assert stats.sweeps_refused == 1


async def test_the_completer_says_it_is_stalled_when_outcomes_wait_unwritten(
    pool: AsyncPool,
) -> None:
    clock = ManualClock()
    holdings = Holdings(1, clock)
    completer = Completer(
        pool, CompleterSettings(worker_id=WORKER), clock, holdings, DaemonStats(), Waker(),
        lambda job: None,
    )  # fmt: skip
    assert not completer.stalled(60.0)  # nothing pending: idle, not stalled
    completer._inbox.put(object())  # type: ignore[arg-type]  # an outcome waiting
    clock.advance(61)
    assert completer.stalled(60.0)


async def test_the_sweeper_says_it_is_stalled_when_its_passes_are_refused(
    pool: AsyncPool, registry: Registry
) -> None:
    clock = ManualClock()
    cfg = _sweeper_settings()
    sweeper = Sweeper(pool, cfg, clock, registry, DaemonStats(), lambda job: None)

    async def refused() -> SweepCounts:
        raise DatabaseError("sweep failed: too much")

    # bounds: the death check's 60 s (the given bound), the sweep's 3 x 60 s interval
    clock.advance(50)
    assert await sweeper._survive(refused, "sweep")() == {}
    assert not sweeper.stalled(60.0)
    clock.advance(131)
    assert await sweeper._survive(refused, "sweep")() == {}
    assert sweeper.stalled(60.0)  # passes keep ending, none of them went through
    # real passes of both kinds on the database end the stall
    assert await sweeper._survive(sweeper.check_deaths, "death check")() == {}
    assert sweeper.stalled(60.0)  # the sweep itself still has not passed
    assert await sweeper._survive(sweeper.sweep_stale, "sweep")() == {}
    assert not sweeper.stalled(60.0)


async def test_the_heartbeat_says_it_is_stalled_when_no_beat_is_written(pool: AsyncPool) -> None:
    clock = ManualClock()
    holdings = Holdings(1, clock)
    heartbeat = Heartbeat(pool, HeartbeatSettings(tick_s=1.0, beat_s=10.0), clock, holdings)
    assert not heartbeat.stalled(60.0)
    clock.advance(61)
    assert heartbeat.stalled(60.0)  # no tick ran for longer than the bound
    await heartbeat.run_once()  # a beat on the real database (nothing held)
    assert not heartbeat.stalled(60.0)
    clock.advance(25)
    assert not heartbeat.stalled(20.0)  # three beat periods (30 s) when longer than the bound
    clock.advance(6)
    assert heartbeat.stalled(20.0)
