"""The operations on jobs every front end calls (jobsd.ops): retry as a new job, the list
with its filters and keyset pages, cancel, the sync twins, each as an operator or an org."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from support.history import assert_history_complete
from support.jobs import job_row, make_job, make_jobs

from jobsd.errors import CancelRefused, JobNotFound, OrgQuotaExceeded, QueueFull, RetryRefused
from jobsd.ops import Caller
from jobsd.ops.cancel import cancel_job, cancel_job_sync
from jobsd.ops.listing import list_jobs, list_jobs_sync
from jobsd.ops.retry import retry_job, retry_job_sync

pytestmark = pytest.mark.anyio

OP = Caller.as_operator("op")


def events(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT from_status, to_status, attempt, worker_id, reason FROM jobsd.all_job_events "
        "WHERE job_id = %s ORDER BY id",
        (job_id,),
    ).fetchall()


def at_most_once(conn: psycopg.Connection[Any], type: str) -> None:
    conn.execute(
        "INSERT INTO jobsd.job_types (type, delivery, max_attempts) VALUES (%s, 'at_most_once', 1)",
        (type,),
    )


@pytest.mark.parametrize("status", ["failed", "cancelled"])
async def test_retry_makes_a_new_job_and_the_ended_one_stays_as_it_ended(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any], status: str
) -> None:
    claim = {"attempts": 1, "worker_id": "w1"}
    job_id = make_job(
        conn, status=status, claim=claim, error="boom", finished_at=datetime.now(UTC), priority=3
    )
    before = job_row(conn, job_id)
    retried = await retry_job(aconn, Caller.as_operator("cli:alice"), job_id)
    new = retried.job
    assert retried.created and new.id != job_id and new.retry_of == job_id
    assert new.status == "queued" and new.attempts == 0 and new.reason == f"retry of {job_id}"
    assert (new.type, new.queue, new.org_id, new.payload, new.priority) == (
        before["type"], before["queue"], before["org_id"], before["payload"], 3,  # type: ignore[index]
    )  # fmt: skip
    # the ended job is as it was; its history notes the retry, the new job's names it
    after = job_row(conn, job_id)
    assert after == before
    note = (status, status, before["attempts"], "cli:alice", f"retried as {new.id}")  # type: ignore[index]
    assert events(conn, job_id)[-1] == note
    assert events(conn, new.id) == [(None, "queued", 0, "cli:alice", f"retry of {job_id}")]
    assert_history_complete(conn)
    # a terminal job never moves again, by any path
    with pytest.raises(psycopg.errors.CheckViolation, match="illegal transition"):
        conn.execute("UPDATE jobsd.jobs SET status = 'queued' WHERE id = %s", (job_id,))


async def test_a_retry_is_made_once_asking_again_answers_the_same_job(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    job_id = make_job(conn, status="failed")
    first = await retry_job(aconn, OP, job_id)
    again = await retry_job(aconn, OP, job_id)
    assert not again.created and again.job.id == first.job.id
    count = conn.execute("SELECT count(*) FROM jobsd.jobs WHERE retry_of = %s", (job_id,))
    assert count.fetchone() == (1,)
    # the retried job reads with its link
    from jobsd.ops.get import get_job

    view = await get_job(aconn, OP, job_id)
    assert view.job.retried_as == first.job.id and view.job.status == "failed"


async def test_a_retry_is_admitted_like_an_enqueue_capacity_and_org_quota(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    conn.execute("INSERT INTO jobsd.queues (name, capacity) VALUES ('small', 1)")
    failed = make_job(conn, status="failed", queue="small")
    make_job(conn, queue="small")  # the one open job the capacity allows
    with pytest.raises(QueueFull):
        await retry_job(aconn, OP, failed)
    assert conn.execute(
        "SELECT count(*) FROM jobsd.jobs WHERE retry_of = %s", (failed,)
    ).fetchone() == (0,)
    assert [e[4] for e in events(conn, failed) if e[0] == e[1]] == []  # no note either
    conn.execute("INSERT INTO jobsd.queues (name, org_open_limit) VALUES ('fair', 1)")
    mine = make_job(conn, status="failed", queue="fair", org_id="acme")
    make_job(conn, queue="fair", org_id="acme")
    with pytest.raises(OrgQuotaExceeded):
        await retry_job(aconn, Caller.for_org("acme", "api"), mine)
    # another org is not held back by acme's quota
    theirs = make_job(conn, status="failed", queue="fair", org_id="globex")
    assert (await retry_job(aconn, Caller.for_org("globex", "api"), theirs)).created


@pytest.mark.parametrize("status", ["queued", "scheduled", "blocked", "running", "succeeded"])
async def test_retry_of_a_job_not_failed_or_cancelled_is_refused(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any], status: str
) -> None:
    job_id = make_job(conn, status=status)
    before = job_row(conn, job_id)
    with pytest.raises(RetryRefused, match=f"it is {status}") as info:
        await retry_job(aconn, OP, job_id)
    assert info.value.why == "not_ended"
    assert job_row(conn, job_id) == before


async def test_retry_of_an_at_most_once_type_needs_force(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    at_most_once(conn, "charge")
    job_id = make_job(conn, status="failed", type="charge")
    with pytest.raises(RetryRefused, match="at_most_once") as info:
        await retry_job(aconn, OP, job_id)
    assert info.value.why == "at_most_once"
    retried = await retry_job(aconn, OP, job_id, force=True)
    assert retried.job.status == "queued"
    assert retried.job.reason == f"retry (forced) of {job_id}"


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
        await retry_job(aconn, OP, child)
    assert info.value.why == "dependency"
    await retry_job(aconn, OP, parent)
    assert job_row(conn, child)["status"] == "failed"  # type: ignore[index]


async def test_retry_is_scoped_by_org(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    job_id = make_job(conn, status="failed", org_id="acme")
    with pytest.raises(JobNotFound):
        await retry_job(aconn, Caller.for_org("globex", "api"), job_id)
    with pytest.raises(JobNotFound):
        await retry_job(aconn, OP, uuid.uuid4())
    assert conn.execute(
        "SELECT count(*) FROM jobsd.jobs WHERE retry_of = %s", (job_id,)
    ).fetchone() == (0,)
    retried = await retry_job(aconn, Caller.for_org("acme", "api"), job_id)
    assert retried.job.org_id == "acme"


def test_a_caller_needs_an_actor_and_an_org_or_operator() -> None:
    with pytest.raises(ValueError, match="actor"):
        Caller.as_operator("")
    with pytest.raises(ValueError, match="one org"):
        Caller.for_org("", "api")


def test_retry_sync(conn: psycopg.Connection[Any]) -> None:
    job_id = make_job(conn, status="failed")
    with psycopg.connect(conn.info.dsn, autocommit=True) as sync:
        retried = retry_job_sync(sync, Caller.as_operator("script"), job_id)
        assert retried.job.status == "queued"
        again = retry_job_sync(sync, Caller.as_operator("script"), job_id)
        assert again.job.id == retried.job.id and not again.created
    assert events(conn, job_id)[-1][3:] == ("script", f"retried as {retried.job.id}")


async def test_list_pages_newest_first_without_gaps_or_repeats(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    ids = make_jobs(conn, 7)
    seen: list[uuid.UUID] = []
    page = await list_jobs(aconn, OP, limit=3)
    while True:
        seen += [j.id for j in page.jobs]
        if page.next is None:
            break
        page = await list_jobs(aconn, OP, limit=3, after=page.next)
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
        return {j.id for j in (await list_jobs(aconn, OP, **filters)).jobs}

    assert await ids() == {old, failed, mail, other_org}
    assert await ids(status="failed") == {failed}
    assert await ids(type="b") == {mail}
    assert await ids(queue="mail") == {mail}
    assert await ids(org_id="globex") == {other_org}
    assert await ids(org_id="o", type="a") == {old, failed}
    assert await ids(since=datetime.now(UTC) - timedelta(days=1)) == {failed, mail, other_org}
    with psycopg.connect(conn.info.dsn, autocommit=True) as sync:
        page = list_jobs_sync(sync, OP, status="queued", org_id="o")
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
        await list_jobs(aconn, OP, **filters)


async def test_an_org_lists_its_own_jobs_only(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    mine = make_job(conn, org_id="acme")
    make_job(conn, org_id="globex")
    acme = Caller.for_org("acme", "api")
    assert [j.id for j in (await list_jobs(aconn, acme)).jobs] == [mine]
    assert (await list_jobs(aconn, acme, org_id="globex")).jobs == []
    assert [j.id for j in (await list_jobs(aconn, acme, org_id="acme")).jobs] == [mine]


async def test_cancel_through_the_shared_module(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    job_id = make_job(conn)
    out = await cancel_job(aconn, OP, job_id, reason="not needed")
    assert out.action == "cancelled" and out.changed
    running = make_job(conn, status="running", org_id="acme")
    with psycopg.connect(conn.info.dsn, autocommit=True) as sync:
        done = cancel_job_sync(sync, OP, running, reason="x")
        assert done.action == "requested" and done.changed
        again = cancel_job_sync(sync, Caller.for_org("acme", "api"), running, reason="x")
        assert again.action == "requested" and not again.changed
        with pytest.raises(JobNotFound):
            cancel_job_sync(sync, Caller.for_org("globex", "api"), running, reason="x")
        repeat = cancel_job_sync(sync, OP, job_id, reason="again")
    assert repeat.action == "cancelled" and not repeat.changed
    # the request is in the running job's history, naming who asked, once
    notes = [e for e in events(conn, running) if e[4] == "cancel requested"]
    assert notes == [("running", "running", 0, "op", "cancel requested")]
    finished = make_job(conn, status="succeeded")
    with pytest.raises(CancelRefused, match="already succeeded") as info:
        await cancel_job(aconn, OP, finished, reason="late")
    assert info.value.why == "finished"
