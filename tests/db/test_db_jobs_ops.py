"""The shared operations on jobs (jobsd.store.jobs_ops, migration 0014): retry of a
failed or cancelled job, the list with its filters and keyset pages, the sync twins."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from support.history import assert_history_complete
from support.jobs import job_row, make_job, make_jobs

from jobsd.errors import JobNotFound, RetryRefused
from jobsd.store import jobs_ops

pytestmark = pytest.mark.anyio


def events(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT from_status, to_status, attempt, worker_id, reason FROM jobsd.job_events "
        "WHERE job_id = %s ORDER BY id",
        (job_id,),
    ).fetchall()


def at_most_once(conn: psycopg.Connection[Any], type: str) -> None:
    conn.execute(
        "INSERT INTO jobsd.job_types (type, delivery, max_attempts) VALUES (%s, 'at_most_once', 1)",
        (type,),
    )


@pytest.mark.parametrize("status", ["failed", "cancelled"])
async def test_retry_puts_an_ended_job_back_in_queued_with_its_history(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any], status: str
) -> None:
    claim = {"attempts": 1, "worker_id": "w1"}
    job_id = make_job(conn, status=status, claim=claim, error="boom", finished_at=datetime.now(UTC))
    job = await jobs_ops.retry_job(aconn, job_id, actor="cli:alice")
    assert job.status == "queued" and job.finished_at is None and job.reason == "retry"
    row = job_row(conn, job_id)
    assert row is not None and row["status"] == "queued" and row["lease_id"] is None
    last = events(conn, job_id)[-1]
    assert last == (status, "queued", job.attempts, "cli:alice", "retry")
    # the chain stays gapless: the retry is the one edge allowed out of an end
    assert_history_complete(conn)
    # the setting that lets the edge pass is gone: a plain update is still refused
    conn.execute("UPDATE jobsd.jobs SET status = 'cancelled' WHERE id = %s", (job_id,))
    with pytest.raises(psycopg.errors.CheckViolation, match="illegal transition"):
        conn.execute("UPDATE jobsd.jobs SET status = 'queued' WHERE id = %s", (job_id,))


def test_a_terminal_job_cannot_go_back_to_queued_but_through_job_retry(
    conn: psycopg.Connection[Any],
) -> None:
    job_id = make_job(conn, status="failed")
    with pytest.raises(psycopg.errors.CheckViolation, match="illegal transition"):
        conn.execute("UPDATE jobsd.jobs SET status = 'queued' WHERE id = %s", (job_id,))
    # the setting names one job: another job's retry does not open this one
    other = make_job(conn, status="failed")
    with conn.transaction():
        conn.execute("SELECT set_config('jobsd.retrying', %s, true)", (str(other),))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE jobsd.jobs SET status = 'queued' WHERE id = %s", (job_id,))


@pytest.mark.parametrize("status", ["queued", "scheduled", "blocked", "running", "succeeded"])
async def test_retry_of_a_job_not_failed_or_cancelled_is_refused(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any], status: str
) -> None:
    job_id = make_job(conn, status=status)
    before = job_row(conn, job_id)
    with pytest.raises(RetryRefused, match=f"it is {status}") as info:
        await jobs_ops.retry_job(aconn, job_id, actor="op")
    assert info.value.why == "not_ended"
    assert job_row(conn, job_id) == before


async def test_retry_of_an_at_most_once_type_needs_force(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    at_most_once(conn, "charge")
    job_id = make_job(conn, status="failed", type="charge")
    with pytest.raises(RetryRefused, match="at_most_once") as info:
        await jobs_ops.retry_job(aconn, job_id, actor="op")
    assert info.value.why == "at_most_once"
    assert job_row(conn, job_id)["status"] == "failed"  # type: ignore[index]
    job = await jobs_ops.retry_job(aconn, job_id, actor="op", force=True)
    assert job.status == "queued" and job.reason == "retry (forced)"


async def test_retry_of_a_job_whose_dependency_failed_is_refused(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    parent = make_job(conn, status="failed")
    child = make_job(conn, status="failed")
    conn.execute(
        "INSERT INTO jobsd.job_dependencies (job_id, depends_on, org_id) VALUES (%s, %s, 'o')",
        (child, parent),
    )
    with pytest.raises(RetryRefused, match="depends on") as info:
        await jobs_ops.retry_job(aconn, child, actor="op")
    assert info.value.why == "dependency"
    await jobs_ops.retry_job(aconn, parent, actor="op")
    assert job_row(conn, child)["status"] == "failed"  # type: ignore[index]


async def test_retry_is_scoped_by_org(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    job_id = make_job(conn, status="failed", org_id="acme")
    with pytest.raises(JobNotFound):
        await jobs_ops.retry_job(aconn, job_id, actor="api", org_id="globex")
    with pytest.raises(JobNotFound):
        await jobs_ops.retry_job(aconn, uuid.uuid4(), actor="api")
    assert job_row(conn, job_id)["status"] == "failed"  # type: ignore[index]
    job = await jobs_ops.retry_job(aconn, job_id, actor="api", org_id="acme")
    assert job.status == "queued"


async def test_retry_needs_an_actor(aconn: psycopg.AsyncConnection[Any]) -> None:
    with pytest.raises(ValueError, match="actor"):
        await jobs_ops.retry_job(aconn, uuid.uuid4(), actor="")


def test_retry_sync(conn: psycopg.Connection[Any]) -> None:
    job_id = make_job(conn, status="failed")
    with psycopg.connect(conn.info.dsn, autocommit=True) as sync:
        job = jobs_ops.retry_job_sync(sync, job_id, actor="script")
        assert job.status == "queued"
        with pytest.raises(RetryRefused):
            jobs_ops.retry_job_sync(sync, job_id, actor="script")
    assert events(conn, job_id)[-1][3:] == ("script", "retry")


async def test_list_pages_newest_first_without_gaps_or_repeats(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    ids = make_jobs(conn, 7)
    seen: list[uuid.UUID] = []
    page = await jobs_ops.list_jobs(aconn, limit=3)
    while True:
        seen += [j.id for j in page.jobs]
        if page.next is None:
            break
        page = await jobs_ops.list_jobs(aconn, limit=3, after=page.next)
    with conn.cursor(row_factory=dict_row) as cur:
        newest_first = [
            r["id"]
            for r in cur.execute("SELECT id FROM jobsd.jobs ORDER BY created_at DESC, id DESC")
        ]
    assert seen == newest_first and sorted(seen) == sorted(ids)


async def test_list_filters(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    conn.execute("INSERT INTO jobsd.queues (name) VALUES ('mail')")
    old = make_job(conn, type="a", created_at=datetime.now(UTC) - timedelta(days=2))
    failed = make_job(conn, type="a", status="failed")
    mail = make_job(conn, type="b", queue="mail")
    other_org = make_job(conn, type="a", org_id="globex")

    async def ids(**filters: Any) -> set[uuid.UUID]:
        return {j.id for j in (await jobs_ops.list_jobs(aconn, **filters)).jobs}

    assert await ids() == {old, failed, mail, other_org}
    assert await ids(status="failed") == {failed}
    assert await ids(type="b") == {mail}
    assert await ids(queue="mail") == {mail}
    assert await ids(org_id="globex") == {other_org}
    assert await ids(org_id="o", type="a") == {old, failed}
    assert await ids(since=datetime.now(UTC) - timedelta(days=1)) == {failed, mail, other_org}
    with psycopg.connect(conn.info.dsn, autocommit=True) as sync:
        page = jobs_ops.list_jobs_sync(sync, status="queued", org_id="o")
    assert {j.id for j in page.jobs} == {old, mail} and page.next is None


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ({"status": "done"}, "unknown status 'done'"),
        ({"limit": 0}, "limit must be between 1 and 1000"),
        ({"limit": 1001}, "limit must be between 1 and 1000"),
        ({"since": datetime(2030, 1, 1)}, "time zone"),
        ({"org_id": ""}, "org must be a non-empty string"),
    ],
)
async def test_list_refuses_bad_filters(
    aconn: psycopg.AsyncConnection[Any], filters: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        await jobs_ops.list_jobs(aconn, **filters)


async def test_cancel_through_the_shared_module(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    job_id = make_job(conn)
    out = await jobs_ops.cancel_job(aconn, job_id, actor="op", reason="not needed")
    assert out.action == "cancelled"
    running = make_job(conn, status="running", org_id="acme")
    with psycopg.connect(conn.info.dsn, autocommit=True) as sync:
        assert jobs_ops.cancel_job_sync(sync, running, actor="op", reason="x").action == "requested"
        assert jobs_ops.cancel_job_sync(sync, running, actor="op", reason="x", org_id="globex") == (
            jobs_ops.CancelOutcome("none", None)
        )
        done = jobs_ops.cancel_job_sync(sync, job_id, actor="op", reason="again")
    assert done.action == "none" and done.job is not None and done.job.status == "cancelled"
