"""The claim: exclusive under concurrency, dedup key kept or released, leases fence writes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest
from dbcheck import count_jobs, history, job_row
from support.jobs import make_jobs

from jobsd import SyncClient
from jobsd.client import JobSpec
from jobsd.models import Job
from jobsd.store import queries
from jobsd.store.queries import FinishRow
from jobsd.worker.decide import rescuer, rules_from

pytestmark = pytest.mark.anyio

Conn = psycopg.AsyncConnection[Any]


async def _claim(aconn: Conn, worker: str, limit: int = 10, **kw: Any) -> list[Job]:
    kw.setdefault("queues", None)
    kw.setdefault("keep_dedup_types", [])
    return await queries.claim_batch(aconn, limit=limit, worker_id=worker, **kw)


async def test_two_concurrent_claimers_never_get_the_same_job(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    total = 400
    make_jobs(conn, total)
    got: dict[str, list[uuid.UUID]] = {"w1": [], "w2": []}
    rounds: dict[str, int] = {"w1": 0, "w2": 0}

    async def claimer(worker: str, c: Conn, go: anyio.Event) -> None:
        await go.wait()
        while True:
            batch = await _claim(c, worker, limit=3)
            if not batch:
                return
            rounds[worker] += 1
            assert all(j.worker_id == worker and j.status == "running" for j in batch)
            got[worker].extend(j.id for j in batch)

    # both connected before either claims, so neither drains the table alone
    c1 = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    c2 = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    async with c1, c2:
        go = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(claimer, "w1", c1, go)
            tg.start_soon(claimer, "w2", c2, go)
            go.set()

    both = got["w1"] + got["w2"]
    assert len(both) == len(set(both)) == total
    assert not set(got["w1"]) & set(got["w2"])
    assert rounds["w1"] > 5 and rounds["w2"] > 5  # they really took turns
    rows = conn.execute(
        "SELECT worker_id, count(*) FROM jobsd.jobs WHERE status = 'running' AND attempts = 1 "
        "GROUP BY worker_id ORDER BY worker_id"
    ).fetchall()
    assert rows == [("w1", len(got["w1"])), ("w2", len(got["w2"]))]
    claims = conn.execute(
        "SELECT count(*), count(DISTINCT job_id) "
        "FROM jobsd.all_job_events WHERE to_status = 'running'"
    ).fetchone()
    assert claims == (total, total)


async def test_claim_takes_the_oldest_and_only_from_the_given_queues(
    db_url: str, aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("INSERT INTO jobsd.queues (name) VALUES ('mail')")
    with SyncClient(db_url) as client:
        first = client.enqueue("t", {}, org_id="o")
        mail = client.enqueue("t", {}, org_id="o", queue="mail")
        second = client.enqueue("t", {}, org_id="o")

    assert [j.id for j in await _claim(aconn, "w", limit=1, queues=["default"])] == [first.id]
    assert [j.id for j in await _claim(aconn, "w", queues=["default"])] == [second.id]
    assert [j.id for j in await _claim(aconn, "w")] == [mail.id]
    assert await _claim(aconn, "w") == []


async def test_keep_dedup_types_keep_their_key_others_release_it(
    db_url: str, aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    with SyncClient(db_url) as client:
        held = client.enqueue("active_type", {}, org_id="o", dedup_key="a")
        freed = client.enqueue("queue_type", {}, org_id="o", dedup_key="q")

        claimed = {j.id: j for j in await _claim(aconn, "w", keep_dedup_types=["active_type"])}
        assert (claimed[held.id].dedup_key, claimed[freed.id].dedup_key) == ("a", None)

        # scope 'active': refused (the running job is returned) while it runs
        assert client.enqueue("active_type", {}, org_id="o", dedup_key="a").id == held.id
        # scope 'queue': accepted at once, no lost wake-up
        again = client.enqueue("queue_type", {}, org_id="o", dedup_key="q")

    assert again.id != freed.id
    assert (again.status, again.dedup_key) == ("queued", "q")
    assert count_jobs(conn) == 3


async def test_finish_with_a_wrong_lease_changes_nothing(
    db_url: str, aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    with SyncClient(db_url) as client:
        job = client.enqueue("t", {}, org_id="o", dedup_key="k")
    (run,) = await _claim(aconn, "w1", keep_dedup_types=["t"])
    before = job_row(conn, job.id)

    written = await queries.finish_batch(
        aconn,
        [FinishRow(job.id, uuid.uuid4(), "succeeded", '{"x": 1}', None, "stale owner", None)],
    )

    assert written == {}
    assert job_row(conn, job.id) == before
    assert len(history(conn, job.id)) == 2
    # the owner of the lease can still finish it, once
    assert run.lease_id is not None
    row = FinishRow(job.id, run.lease_id, "succeeded", None, None, None, None)
    assert list(await queries.finish_batch(aconn, [row])) == [job.id]
    assert await queries.finish_batch(aconn, [row]) == {}
    assert [h[1] for h in history(conn, job.id)] == ["queued", "running", "succeeded"]


async def test_a_job_claimed_again_after_a_sweep_fences_the_old_lease(
    db_url: str, aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    spec = JobSpec.build("t", {}, org_id="o")
    await queries.run_named(aconn, "jobs_insert", spec.insert_params())
    (old,) = await _claim(aconn, "w1")
    await queries.sweep_stale(
        aconn,
        worker_id="sweeper",
        stale_after_s=60,
        decide=rescuer(rules_from(max_attempts={"t": 3})),
        now=datetime.now(UTC) + timedelta(hours=1),
    )
    (new,) = await _claim(aconn, "w2")
    assert new.lease_id != old.lease_id

    assert old.lease_id is not None
    late = FinishRow(spec.id, old.lease_id, "failed", None, "late", None, None)
    assert await queries.finish_batch(aconn, [late]) == {}
    row = job_row(conn, spec.id)
    assert row is not None
    assert (row["status"], row["worker_id"], row["attempts"], row["error"]) == (
        "running",
        "w2",
        2,
        None,
    )


async def test_odd_error_text_of_one_job_does_not_fail_the_batch(
    aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    make_jobs(conn, 4)
    jobs = await _claim(aconn, "w1")
    errors = ["no such file: 'caf\udce9.csv'", "bad byte \x00 here", "\x00" * 2048, "plain"]

    rows = []
    for job, error in zip(jobs, errors, strict=True):
        assert job.lease_id is not None
        rows.append(FinishRow(job.id, job.lease_id, "failed", None, error, "handler\x00", None))
    written = await queries.finish_batch(aconn, rows)

    assert set(written) == {j.id for j in jobs}
    stored = [written[j.id].error for j in jobs]
    assert stored[0] == "no such file: 'caf\ufffd.csv'"
    assert stored[1] == "bad byte \ufffd here"
    assert stored[2] is not None and len(stored[2].encode()) <= 2048
    assert set(stored[2]) == {"\ufffd"}
    assert stored[3] == "plain"
    assert {written[j.id].reason for j in jobs} == {"handler\ufffd"}
    assert count_jobs(conn, "status = 'failed'") == 4


async def test_odd_progress_of_one_job_does_not_fail_the_heartbeat(
    aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    make_jobs(conn, 2)
    a, b = await _claim(aconn, "w1")
    assert a.lease_id is not None and b.lease_id is not None

    alive = set(
        await queries.heartbeat_v2(
            aconn,
            [
                queries.HeartbeatRow(a.id, a.lease_id, {"done": 3}),
                queries.HeartbeatRow(b.id, b.lease_id, {"file": "x\x00\udcff", "k\x00": 1}),
            ],
        )
    )

    assert alive == {a.id, b.id}
    row_a, row_b = job_row(conn, a.id), job_row(conn, b.id)
    assert row_a is not None and row_b is not None
    progress_a, progress_b = row_a["progress"], row_b["progress"]
    assert progress_a["done"] == 3
    assert (progress_b["file"], progress_b["k\ufffd"]) == ("x\ufffd\ufffd", 1)
    assert "updated_at" in progress_a and "updated_at" in progress_b


async def _commit_mode_after_claim(aconn: Conn, **kw: Any) -> tuple[int, str]:
    """Claim inside an open transaction; return the jobs claimed and the
    synchronous_commit its commit will use."""
    async with aconn.transaction():
        jobs = await _claim(aconn, "w1", **kw)
        cur = await aconn.execute("SHOW synchronous_commit")
        row = await cur.fetchone()
        assert row is not None
    return len(jobs), str(row[0])


async def test_a_claim_commits_without_waiting_for_the_disk_unless_asked(
    aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    make_jobs(conn, 2)
    assert await _commit_mode_after_claim(aconn, limit=1) == (1, "off")
    assert await _commit_mode_after_claim(aconn, limit=1, durable=True) == (1, "on")
    # nothing claimed: the session's setting is left alone
    assert await _commit_mode_after_claim(aconn, limit=1) == (0, "on")
    assert (await (await aconn.execute("SHOW synchronous_commit")).fetchone()) == ("on",)


@pytest.mark.parametrize(
    ("free", "claimed", "mode", "left_queued"),
    [
        # the at-most-once job comes first, in the free slot; the other is claimed with it
        (1, 2, "on", []),
        # no free slot: the at-most-once job is not claimed ahead, the other one is
        (0, 1, "off", [("charge",)]),
    ],
)
async def test_a_claim_waits_for_the_disk_only_when_it_takes_an_at_most_once_job(
    aconn: Conn,
    conn: psycopg.Connection[Any],
    free: int,
    claimed: int,
    mode: str,
    left_queued: list[tuple[str]],
) -> None:
    make_jobs(conn, 1, type="charge")
    make_jobs(conn, 1, type="t")
    got = await _commit_mode_after_claim(aconn, limit=2, free=free, at_most_once_types=["charge"])
    assert got == (claimed, mode)
    # the job claimed ahead is reserved: still queued, but not left for other claims
    queued = conn.execute(
        "SELECT type FROM jobsd.jobs WHERE status = 'queued' AND reserved_until IS NULL"
    ).fetchall()
    assert queued == left_queued


async def test_a_claim_that_takes_a_job_with_a_concurrency_key_waits_for_the_disk(
    aconn: Conn, conn: psycopg.Connection[Any]
) -> None:
    make_jobs(conn, 1, concurrency_key="acct-1")
    make_jobs(conn, 1)
    assert await _commit_mode_after_claim(aconn, limit=2) == (2, "on")
