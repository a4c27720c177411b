"""Flow control in the database: capacity, pause, priorities, concurrency keys, dependencies."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest
from dbcheck import Listener, count_jobs, history, job_row
from psycopg import sql
from support.jobs import make_jobs

from jobsd import Client, QueueFull, SyncClient
from jobsd.client import JobSpec
from jobsd.errors import TransientConflict, UnknownDependency
from jobsd.models import Job
from jobsd.ops import Caller
from jobsd.ops.cancel import cancel_job
from jobsd.store import queries
from jobsd.store.queries import FinishRow

pytestmark = pytest.mark.anyio

Conn = psycopg.AsyncConnection[Any]


def _queue(conn: psycopg.Connection[Any], name: str, **limits: Any) -> None:
    cols = ", ".join(["name", *limits])
    marks = ", ".join(["%s"] * (1 + len(limits)))
    conn.execute(f"INSERT INTO jobsd.queues ({cols}) VALUES ({marks})", (name, *limits.values()))


async def _claim(aconn: Conn, worker: str = "w1", limit: int = 10, **kw: Any) -> list[Job]:
    kw.setdefault("queues", None)
    kw.setdefault("keep_dedup_types", [])
    return await queries.claim_batch(aconn, limit=limit, worker_id=worker, **kw)


async def _finish(aconn: Conn, job: Job, status: str = "succeeded") -> None:
    assert job.lease_id is not None
    row = FinishRow(
        job.id, job.lease_id, status, None, None if status == "succeeded" else "x", None, None
    )
    written = await queries.finish_batch(aconn, [row])
    assert job.id in written


# --- capacity ------------------------------------------------------------------------


def test_capacity_refuses_the_enqueue_beyond_it_and_inserts_nothing(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    _queue(conn, "small", capacity=2)
    with SyncClient(db_url) as client:
        first = client.enqueue("t", {}, org_id="o", queue="small")
        client.enqueue("t", {}, org_id="o2", queue="small")  # capacity counts every org
        with pytest.raises(QueueFull) as refused:
            client.enqueue("t", {"n": 3}, org_id="o", queue="small")
        assert refused.value.queue == "small" and refused.value.capacity == 2
        assert "capacity 2" in str(refused.value)
        assert count_jobs(conn, "queue = 'small'") == 2

        # a dedup hit inserts nothing: it is answered even when the queue is full
        conn.execute("UPDATE jobsd.jobs SET dedup_key = 'k' WHERE id = %s", (first.id,))
        again = client.enqueue("t", {}, org_id="o", queue="small", dedup_key="k")
        assert again.id == first.id

        # a terminal job frees its place
        conn.execute(
            "UPDATE jobsd.jobs SET status = 'cancelled', finished_at = now() WHERE id = %s",
            (first.id,),
        )
        client.enqueue("t", {}, org_id="o", queue="small")
        with pytest.raises(QueueFull):
            client.enqueue("t", {}, org_id="o", queue="small")
    assert count_jobs(conn, "queue = 'small' AND status = 'queued'") == 2


async def test_a_bulk_enqueue_past_capacity_inserts_none_of_its_jobs(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    _queue(conn, "small", capacity=3)
    async with Client(db_url) as client:
        await client.enqueue("t", {}, org_id="o", queue="small")
        specs = [JobSpec.build("t", {"i": i}, org_id="o", queue="small") for i in range(3)]
        with pytest.raises(QueueFull):
            await client.enqueue_many(specs)
        assert count_jobs(conn, "queue = 'small'") == 1
        await client.enqueue_many(specs[:2])
    assert count_jobs(conn, "queue = 'small'") == 3


async def test_capacity_holds_under_a_burst_of_concurrent_enqueues(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    capacity, senders = 5, 40
    _queue(conn, "burst", capacity=capacity)
    accepted: list[uuid.UUID] = []
    refused: list[QueueFull] = []
    barrier = threading.Barrier(senders)

    client = SyncClient(db_url)  # with conn= it never opens its own pool

    def send(i: int) -> None:
        # each sender on its own connection, all released at once
        with psycopg.connect(db_url, autocommit=True) as own:
            barrier.wait()
            try:
                job = client.enqueue("t", {"i": i}, org_id=f"o{i % 3}", queue="burst", conn=own)
                accepted.append(job.id)
            except QueueFull as exc:
                refused.append(exc)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(accepted) == capacity
    assert len(refused) == senders - capacity
    assert count_jobs(conn, "queue = 'burst'") == capacity
    assert {
        r[0] for r in conn.execute("SELECT id FROM jobsd.jobs WHERE queue = 'burst'").fetchall()
    } == set(accepted)


def test_capacity_under_repeatable_read_fails_rather_than_overflows(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    _queue(conn, "rr", capacity=1)
    with (
        SyncClient(db_url) as client,
        psycopg.connect(db_url) as a,
        psycopg.connect(db_url) as b,
    ):
        for c in (a, b):
            c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            c.execute("SELECT 1")  # take the snapshot now, before either insert
        client.enqueue("t", {}, org_id="o", queue="rr", conn=a)
        a.commit()
        # b's snapshot cannot see a's job: counting there would let a second one in
        with pytest.raises(TransientConflict, match="serializ"):
            client.enqueue("t", {}, org_id="o", queue="rr", conn=b)
        b.rollback()
    assert count_jobs(conn, "queue = 'rr'") == 1


# --- pause and priorities --------------------------------------------------------------


async def test_a_paused_queue_is_not_claimed_and_others_are(
    db_url: str, aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    _queue(conn, "p")
    with SyncClient(db_url) as client:
        held = [client.enqueue("t", {}, org_id="o", queue="p").id for _ in range(3)]
        other = client.enqueue("t", {}, org_id="o").id
    conn.execute("UPDATE jobsd.queues SET paused_at = now() WHERE name = 'p'")
    claimed = await _claim(aconn)
    assert [j.id for j in claimed] == [other]
    assert await _claim(aconn) == []
    conn.execute("UPDATE jobsd.queues SET paused_at = NULL WHERE name = 'p'")
    assert sorted(j.id for j in await _claim(aconn)) == sorted(held)


async def test_claim_order_is_priority_then_fifo(
    db_url: str, aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    _queue(conn, "second")
    order = [
        (5, "default"),
        (0, "second"),
        (5, "second"),
        (-1, "default"),
        (0, "default"),
        (-1, "second"),
    ]
    async with Client(db_url) as client:
        jobs = [
            await client.enqueue("t", {"n": n}, org_id="o", priority=p, queue=q)
            for n, (p, q) in enumerate(order)
        ]
    expected = [j.id for j in sorted(jobs, key=lambda j: (j.priority, j.created_at))]
    got: list[uuid.UUID] = []
    while batch := await _claim(aconn, limit=2):
        got.extend(j.id for j in batch)
    assert got == expected
    assert [j.priority for j in jobs] == [p for p, _ in order]


@pytest.mark.parametrize("priority", [True, 1.5, 10**7, "1"])
def test_a_bad_priority_is_refused(
    db_url: str, conn: psycopg.Connection[Any], priority: Any
) -> None:
    with SyncClient(db_url) as client, pytest.raises(ValueError, match="priority"):
        client.enqueue("t", {}, org_id="o", priority=priority)
    assert count_jobs(conn) == 0


# --- concurrency keys ------------------------------------------------------------------


async def test_one_job_per_key_runs_and_other_keys_are_not_held_back(
    db_url: str, aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    async with Client(db_url) as client:
        busy = [
            await client.enqueue("crawl", {"i": i}, org_id="o", concurrency_key="site:1")
            for i in range(5)
        ]
        other = await client.enqueue("crawl", {}, org_id="o", concurrency_key="site:2")
        free = await client.enqueue("crawl", {}, org_id="o")
        same_key_other_org = await client.enqueue(
            "crawl", {}, org_id="o2", concurrency_key="site:1"
        )
    first = await _claim(aconn, limit=10)
    assert {j.id for j in first} == {busy[0].id, other.id, free.id, same_key_other_org.id}
    assert await _claim(aconn, "w2", limit=10) == []  # site:1 is at its limit
    await _finish(aconn, next(j for j in first if j.id == busy[0].id))
    second = await _claim(aconn, "w2", limit=10)
    assert [j.id for j in second] == [busy[1].id]
    keys = conn.execute(
        "SELECT org_id, concurrency_key, running FROM jobsd.concurrency_keys ORDER BY 1, 2"
    ).fetchall()
    assert keys == [("o", "site:1", 1), ("o", "site:2", 1), ("o2", "site:1", 1)]


async def test_a_round_leaving_jobs_behind_a_key_says_so(db_url: str, aconn: Conn) -> None:
    async with Client(db_url) as client:
        for _ in range(3):
            await client.enqueue("t", {}, org_id="o", concurrency_key="k")
        tail = await client.enqueue("t", {}, org_id="o")
    first = await _claim(aconn, limit=2)
    assert len(first) == 1 and first[0].concurrency_key == "k"
    assert isinstance(first, queries.ClaimRound) and first.left_for_busy_keys
    second = await _claim(aconn, limit=2)
    assert [j.id for j in second] == [tail.id]


async def test_the_queue_and_the_type_set_the_key_limit(
    db_url: str, aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    _queue(conn, "wide", concurrency_limit=3)
    async with Client(db_url) as client:
        for _ in range(5):
            await client.enqueue("a", {}, org_id="o", queue="wide", concurrency_key="k")
        for _ in range(5):
            await client.enqueue("b", {}, org_id="o", concurrency_key="kb")
    got: list[Job] = []
    while batch := await _claim(aconn, limit=10, key_limits={"b": 2}):
        got.extend(batch)
    assert sorted(j.type for j in got) == ["a", "a", "a", "b", "b"]


async def test_concurrent_claimers_never_exceed_a_key_limit(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    keys, per_key, limit = 4, 30, 2
    _queue(conn, "k", concurrency_limit=limit)
    make_jobs(
        conn, keys * per_key, queue="k", concurrency_key=sql.SQL("'key' || (g % {})").format(keys)
    )
    conn.execute(
        "INSERT INTO jobsd.concurrency_keys (org_id, concurrency_key) "
        "SELECT DISTINCT org_id, concurrency_key FROM jobsd.jobs ON CONFLICT DO NOTHING"
    )
    peak = 0
    finished = 0

    async def worker(name: str) -> None:
        nonlocal peak, finished
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as own:
            idle = 0
            while idle < 3:
                batch = await _claim(own, name, limit=3)
                cur = await own.execute(
                    "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM jobsd.jobs "
                    "WHERE status = 'running' GROUP BY concurrency_key) AS c"
                )
                row = await cur.fetchone()
                assert row is not None
                peak = max(peak, row[0])
                idle = 0 if batch else idle + 1
                for job in batch:
                    await _finish(own, job)
                    finished += 1

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(worker, f"w{i}")
    assert finished == keys * per_key
    assert 1 <= peak <= limit
    assert conn.execute("SELECT max(running) FROM jobsd.concurrency_keys").fetchone() == (0,)


async def test_claim_one_respects_pause_and_key_limits(
    db_url: str, aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    _queue(conn, "p")
    async with Client(db_url) as client:
        a = await client.enqueue("t", {}, org_id="o", concurrency_key="k")
        b = await client.enqueue("t", {}, org_id="o", concurrency_key="k")
        c = await client.enqueue("t", {}, org_id="o", queue="p")
    conn.execute("UPDATE jobsd.queues SET paused_at = now() WHERE name = 'p'")
    await queries.claim_job(aconn, a.id, "w1")
    with pytest.raises(Exception, match="concurrency key 'k'"):
        await queries.claim_job(aconn, b.id, "w1")
    with pytest.raises(Exception, match="paused"):
        await queries.claim_job(aconn, c.id, "w1")
    assert job_row(conn, b.id)["status"] == "queued"  # type: ignore[index]
    assert job_row(conn, c.id)["status"] == "queued"  # type: ignore[index]


# --- dependencies ----------------------------------------------------------------------


async def test_a_chain_of_three_with_a_failure_in_the_middle(
    db_url: str, aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    async with Client(db_url) as client:
        a = await client.enqueue("a", {}, org_id="o")
        b = await client.enqueue("b", {}, org_id="o", depends_on=[a.id])
        c = await client.enqueue("c", {}, org_id="o", depends_on=[b.id])
    assert (a.status, b.status, c.status) == ("queued", "blocked", "blocked")

    (claimed,) = await _claim(aconn)
    assert claimed.id == a.id  # blocked jobs are not claimable
    await _finish(aconn, claimed)
    assert job_row(conn, b.id)["status"] == "queued"  # type: ignore[index]
    assert job_row(conn, c.id)["status"] == "blocked"  # type: ignore[index]

    (claimed,) = await _claim(aconn)
    assert claimed.id == b.id
    await _finish(aconn, claimed, "failed")
    row = job_row(conn, c.id)
    assert row is not None
    assert row["status"] == "failed"
    assert row["reason"] == f"dependency {b.id} failed"
    assert row["error"] == f"dependency {b.id} failed"
    assert row["finished_at"] is not None
    assert [(h[0], h[1]) for h in history(conn, c.id)] == [(None, "blocked"), ("blocked", "failed")]
    assert await _claim(aconn) == []


async def test_a_cancelled_dependency_fails_the_whole_chain(
    db_url: str, aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    async with Client(db_url) as client:
        a = await client.enqueue("a", {}, org_id="o")
        chain = [a]
        for _ in range(4):
            chain.append(await client.enqueue("n", {}, org_id="o", depends_on=[chain[-1].id]))
    await cancel_job(aconn, Caller.as_operator("op"), a.id, reason="cancelled by operator")
    rows = [job_row(conn, j.id) for j in chain[1:]]
    assert [r["status"] for r in rows if r] == ["failed"] * 4
    assert rows[0] and rows[0]["reason"] == f"dependency {a.id} cancelled"
    assert rows[3] and rows[3]["reason"] == f"dependency {chain[3].id} failed"


async def test_a_job_waits_for_every_dependency(
    db_url: str, aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    async with Client(db_url) as client:
        p1 = await client.enqueue("p", {}, org_id="o")
        p2 = await client.enqueue("p", {}, org_id="o")
        both = await client.enqueue("d", {}, org_id="o", depends_on=[p1.id, p2.id, p1.id])
        timed = await client.enqueue("d", {}, org_id="o", depends_on=[p1.id], run_after=later)
    first, second = await _claim(aconn, limit=2)
    await _finish(aconn, first)
    assert job_row(conn, both.id)["status"] == "blocked"  # type: ignore[index]
    await _finish(aconn, second)
    row = job_row(conn, both.id)
    assert row and row["status"] == "queued" and row["reason"] == "dependencies succeeded"
    assert job_row(conn, timed.id)["status"] == "scheduled"  # type: ignore[index]
    edges = conn.execute(
        "SELECT count(*) FROM jobsd.job_dependencies WHERE job_id = %s", (both.id,)
    ).fetchone()
    assert edges == (2,)


async def test_dependencies_already_ended_decide_at_enqueue(
    db_url: str, aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    async with Client(db_url) as client:
        ok = await client.enqueue("p", {}, org_id="o")
        bad = await client.enqueue("p", {}, org_id="o")
        first, second = await _claim(aconn, limit=2)
        await _finish(aconn, first)
        await _finish(aconn, second, "failed")
        ready = await client.enqueue("d", {}, org_id="o", depends_on=[ok.id])
        doomed = await client.enqueue("d", {}, org_id="o", depends_on=[ok.id, bad.id])
    assert ready.status == "queued"
    assert doomed.status == "failed"
    assert doomed.reason == f"dependency {bad.id} failed"


async def test_unknown_foreign_and_self_dependencies_are_refused(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with Client(db_url) as client:
        mine = await client.enqueue("p", {}, org_id="o")
        theirs = await client.enqueue("p", {}, org_id="other")
        ghost = uuid.uuid4()
        with pytest.raises(UnknownDependency) as unknown:
            await client.enqueue("d", {}, org_id="o", depends_on=[mine.id, ghost])
        assert unknown.value.job_ids == [str(ghost)]
        with pytest.raises(UnknownDependency):
            await client.enqueue("d", {}, org_id="o", depends_on=[theirs.id])
        own_id = uuid.uuid4()
        with pytest.raises(ValueError, match="itself"):
            await client.enqueue("d", {}, org_id="o", job_id=own_id, depends_on=[own_id])
        with pytest.raises(ValueError, match="not a job id"):
            await client.enqueue("d", {}, org_id="o", depends_on=["nope"])
    assert count_jobs(conn) == 2
    assert conn.execute("SELECT count(*) FROM jobsd.job_dependencies").fetchone() == (0,)
    # the refused enqueues rolled back their marks too
    assert conn.execute("SELECT count(*) FROM jobsd.jobs WHERE has_dependents").fetchone() == (0,)


def test_two_dependencies_ending_at_once_release_their_dependent(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    with SyncClient(db_url) as client:
        p1 = client.enqueue("p", {}, org_id="o")
        p2 = client.enqueue("p", {}, org_id="o")
        d = client.enqueue("d", {}, org_id="o", depends_on=[p1.id, p2.id])
    conn.execute("UPDATE jobsd.jobs SET status = 'running' WHERE id IN (%s, %s)", (p1.id, p2.id))
    end = "UPDATE jobsd.jobs SET status = 'succeeded', finished_at = now() WHERE id = %s"
    with psycopg.connect(db_url) as t1, psycopg.connect(db_url) as t2:
        t1.execute(end, (p1.id,))  # holds d's row lock until it commits
        done = threading.Event()

        def second() -> None:
            t2.execute(end, (p2.id,))  # waits for t1 on d, then sees p1 succeeded
            t2.commit()
            done.set()

        thread = threading.Thread(target=second)
        thread.start()
        waiting = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        )
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        while waiting.fetchone() != (1,) and datetime.now(UTC) < deadline:
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            )
        assert not done.is_set()
        t1.commit()
        thread.join(timeout=10)
        assert done.is_set()
    row = job_row(conn, d.id)
    assert row and row["status"] == "queued"


def test_enqueueing_a_dependent_wakes_the_queue_of_a_queued_dependency(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    # The enqueue locks its dependencies: a claimer running meanwhile skips a queued
    # one, so the commit must wake the claimers of its queue again.
    _queue(conn, "mail")
    with SyncClient(db_url) as client:
        queued = client.enqueue("p", {}, org_id="o", queue="mail")
        later = client.enqueue("p", {}, org_id="o", run_after=datetime.now(UTC) + timedelta(1))
        listener = Listener(db_url)
        try:
            client.enqueue("d", {}, org_id="o", depends_on=[queued.id])
            assert listener.collect(conn) == ["mail"]
            client.enqueue("d", {}, org_id="o", depends_on=[later.id])
            assert listener.collect(conn) == ["default"]
        finally:
            listener.close()
