"""Queue administration (jobsd.admin.queues, migration 0009): declare, limit, list, pause,
resume, drop; the wake-up of a resume; a drop racing an enqueue."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import psycopg
import pytest
from dbcheck import Listener, count_jobs
from psycopg import sql
from support import jobs
from support.waiting import wait_until

from jobsd import Client, JobsdError, UnknownQueue
from jobsd.admin.queues import (
    UNCHANGED,
    create_queue,
    drop_queue,
    get_queue,
    list_queues,
    pause_queue,
    resume_queue,
    set_queue_limits,
)
from jobsd.errors import QueueExists, QueueNotEmpty
from jobsd.models import QueueInfo


def make_job(
    conn: psycopg.Connection[Any], *, queue: str, status: str, org_id: str = "acme"
) -> uuid.UUID:
    """Insert a job of ``org_id`` into ``queue`` and walk it to ``status`` (as superuser)."""
    return jobs.make_job(
        conn,
        org_id=org_id,
        queue=queue,
        status=status,
        run_after=sql.SQL("now() + interval '1 hour'" if status == "scheduled" else "now()"),
        finished_at=jobs.NOW if status in jobs.TERMINAL else None,
    )


def queue_row(conn: psycopg.Connection[Any], name: str) -> tuple[Any, ...] | None:
    return conn.execute(
        "SELECT capacity, concurrency_limit, retention_days, paused_at "
        "FROM jobsd.queues WHERE name = %s",
        (name,),
    ).fetchone()


def _depth(info: QueueInfo) -> dict[str, int]:
    return {k: v for k, v in info.depth.items() if v}


@pytest.mark.anyio
async def test_create_list_and_depth_by_state_over_every_org(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    mail = await create_queue(aconn, "mail", capacity=100, concurrency_limit=3, retention_days=0)
    assert (mail.name, mail.capacity, mail.concurrency_limit, mail.retention_days) == (
        "mail",
        100,
        3,
        0,
    )
    assert not mail.paused and mail.open_jobs == 0
    bare = await create_queue(aconn, "a.b:c-d_9")
    assert (bare.capacity, bare.concurrency_limit, bare.retention_days) == (None, None, None)

    for status, orgs in {
        "queued": ["acme", "acme", "globex"],
        "scheduled": ["globex"],
        "blocked": ["acme"],
        "running": ["acme", "globex"],
        "recovery_required": ["initech"],
        "succeeded": ["acme"],
        "failed": ["globex"],
        "cancelled": ["acme"],
    }.items():
        for org in orgs:
            make_job(conn, queue="mail", status=status, org_id=org)
    make_job(conn, queue="default", status="queued")

    infos = await list_queues(aconn)
    assert [i.name for i in infos] == ["a.b:c-d_9", "default", "mail"]
    by_name = {i.name: i for i in infos}
    assert by_name["mail"].depth == {
        "queued": 3,
        "scheduled": 1,
        "blocked": 1,
        "running": 2,
        "recovery_required": 1,
    }
    assert by_name["mail"].open_jobs == 8  # finished jobs are not open
    assert _depth(by_name["default"]) == {"queued": 1}
    assert _depth(by_name["a.b:c-d_9"]) == {}
    assert await get_queue(aconn, "mail") == by_name["mail"]
    assert by_name["mail"].to_json() == {
        "name": "mail",
        "paused": False,
        "paused_at": None,
        "capacity": 100,
        "concurrency_limit": 3,
        "retention_days": 0,
        "created_at": by_name["mail"].created_at.isoformat(),
        "depth": by_name["mail"].depth,
    }


@pytest.mark.anyio
async def test_create_an_existing_queue_fails_and_changes_nothing(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    await create_queue(aconn, "mail", capacity=5)
    with pytest.raises(QueueExists, match="queue 'mail' exists already") as info:
        await create_queue(aconn, "mail", capacity=50, retention_days=1)
    assert info.value.queue == "mail"
    assert queue_row(conn, "mail") == (5, None, None, None)
    with pytest.raises(QueueExists):
        await create_queue(aconn, "default")


@pytest.mark.anyio
async def test_set_limits_changes_only_what_is_given(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    await create_queue(aconn, "mail", capacity=10, concurrency_limit=2, retention_days=7)
    info = await set_queue_limits(aconn, "mail", capacity=20)
    assert (info.capacity, info.concurrency_limit, info.retention_days) == (20, 2, 7)
    info = await set_queue_limits(aconn, "mail", concurrency_limit=None, retention_days=0)
    assert (info.capacity, info.concurrency_limit, info.retention_days) == (20, None, 0)
    info = await set_queue_limits(
        aconn, "mail", capacity=None, concurrency_limit=UNCHANGED, retention_days=None
    )
    assert queue_row(conn, "mail") == (None, None, None, None)
    assert (info.capacity, info.retention_days) == (None, None)
    # nothing given: nothing changes, the queue comes back
    assert (await set_queue_limits(aconn, "mail")).name == "mail"


@pytest.mark.anyio
async def test_a_capacity_below_the_open_jobs_is_accepted_and_refuses_enqueues(
    db_url: str, aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    await create_queue(aconn, "mail")
    for _ in range(3):
        make_job(conn, queue="mail", status="queued")
    info = await set_queue_limits(aconn, "mail", capacity=2)
    assert info.capacity == 2 and info.open_jobs == 3
    async with Client(db_url) as client:
        with pytest.raises(JobsdError, match="is full"):
            await client.enqueue("t", {}, org_id="acme", queue="mail")
        assert count_jobs(conn, "queue = 'mail'") == 3
        # two finish: one open, under the capacity again
        conn.execute(
            "UPDATE jobsd.jobs SET status = 'cancelled', finished_at = now() WHERE id IN "
            "(SELECT id FROM jobsd.jobs WHERE queue = 'mail' ORDER BY id LIMIT 2)"
        )
        job = await client.enqueue("t", {}, org_id="acme", queue="mail")
    assert job.queue == "mail" and count_jobs(conn, "queue = 'mail'") == 4


@pytest.mark.anyio
async def test_bad_names_and_limits_are_refused_before_the_database(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    for name in ("", "bad name", "-lead", "x" * 64, "mail\n", "é", "a/b"):
        with pytest.raises(ValueError, match="invalid queue name"):
            await create_queue(aconn, name)
    for kwargs in (
        {"capacity": 0},
        {"capacity": -1},
        {"concurrency_limit": 0},
        {"retention_days": -1},
        {"capacity": 2**31},
        {"capacity": True},
        {"capacity": "10"},
    ):
        with pytest.raises(ValueError, match="must be"):
            await create_queue(aconn, "mail", **kwargs)
    assert conn.execute("SELECT name FROM jobsd.queues").fetchall() == [("default",)]
    await create_queue(aconn, "mail", capacity=3)
    with pytest.raises(ValueError, match=r"capacity .* must be a positive integer"):
        await set_queue_limits(aconn, "mail", capacity=0)
    assert queue_row(conn, "mail") == (3, None, None, None)
    # retention 0 is a limit (finished jobs kept no time), not an error
    assert (await set_queue_limits(aconn, "mail", retention_days=0)).retention_days == 0


@pytest.mark.anyio
async def test_unknown_queues_are_unknown_queue_errors(
    aconn: psycopg.AsyncConnection[Any],
) -> None:
    calls: list[Callable[[], Any]] = [
        lambda: get_queue(aconn, "nope"),
        lambda: set_queue_limits(aconn, "nope", capacity=1),
        lambda: pause_queue(aconn, "nope"),
        lambda: resume_queue(aconn, "nope"),
        lambda: drop_queue(aconn, "nope"),
    ]
    for call in calls:
        with pytest.raises(UnknownQueue) as info:
            await call()
        assert info.value.queue == "nope"
    assert [q.name for q in await list_queues(aconn)] == ["default"]


@pytest.mark.anyio
async def test_pause_and_resume_are_idempotent(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    await create_queue(aconn, "mail")
    first = await pause_queue(aconn, "mail")
    assert first.paused and first.paused_at is not None
    again = await pause_queue(aconn, "mail")
    assert again.paused_at == first.paused_at  # the first pause time is kept
    assert queue_row(conn, "mail") == (None, None, None, first.paused_at)

    resumed = await resume_queue(aconn, "mail")
    assert not resumed.paused and resumed.paused_at is None
    assert not (await resume_queue(aconn, "mail")).paused
    assert queue_row(conn, "mail") == (None, None, None, None)
    # other queues are untouched
    assert not (await get_queue(aconn, "default")).paused


@pytest.mark.anyio
async def test_resume_wakes_the_daemons_with_the_queue_name_at_commit(
    db_url: str,
    conn: psycopg.Connection[Any],
    listener: Callable[[], Listener],
) -> None:
    listening = listener()
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
        await create_queue(aconn, "mail")
        assert listening.collect(conn) == []  # declaring a queue wakes nobody
        await pause_queue(aconn, "mail")
        assert listening.collect(conn) == []  # neither does a pause

        await resume_queue(aconn, "mail")
        assert listening.collect(conn) == ["mail"]  # channel jobsd, payload the name

        # in the caller's transaction: sent when it commits, not before
        await pause_queue(aconn, "mail")
        async with aconn.transaction():
            await resume_queue(aconn, "mail")
            assert listening.collect(conn) == []
        assert listening.collect(conn) == ["mail"]

        # and a rolled-back resume sends nothing and leaves the queue paused
        await pause_queue(aconn, "mail")
        with pytest.raises(RuntimeError):
            async with aconn.transaction():
                await resume_queue(aconn, "mail")
                raise RuntimeError("roll back")
        assert listening.collect(conn) == []
        assert (await get_queue(aconn, "mail")).paused


@pytest.mark.anyio
async def test_drop_is_refused_while_jobs_are_open_and_deletes_nothing(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    await create_queue(aconn, "mail")
    make_job(conn, queue="mail", status="succeeded")
    for n, status in enumerate(("queued", "scheduled", "blocked", "running", "recovery_required")):
        open_job = make_job(conn, queue="mail", status=status, org_id="globex")
        with pytest.raises(QueueNotEmpty, match="queue 'mail' holds 1 open job ") as info:
            await drop_queue(aconn, "mail")
        assert (info.value.queue, info.value.open_jobs) == ("mail", 1)
        assert count_jobs(conn, "queue = 'mail'") == 2 + n  # the finished ones too
        assert queue_row(conn, "mail") is not None
        conn.execute(
            "UPDATE jobsd.jobs SET status = 'cancelled', finished_at = now() WHERE id = %s "
            "AND status <> 'running'",
            (open_job,),
        )
        conn.execute(
            "UPDATE jobsd.jobs SET status = 'failed', finished_at = now() WHERE id = %s "
            "AND status = 'running'",
            (open_job,),
        )
    make_job(conn, queue="mail", status="queued")
    make_job(conn, queue="mail", status="running")
    with pytest.raises(QueueNotEmpty, match="holds 2 open jobs"):
        await drop_queue(aconn, "mail")


@pytest.mark.anyio
async def test_drop_deletes_the_finished_jobs_their_history_and_the_queue(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    await create_queue(aconn, "mail", capacity=10)
    await create_queue(aconn, "other")
    gone = [
        make_job(conn, queue="mail", status=s, org_id=org)
        for s, org in (("succeeded", "acme"), ("failed", "globex"), ("cancelled", "acme"))
    ]
    kept = [make_job(conn, queue="other", status=s) for s in ("succeeded", "queued")]

    assert await drop_queue(aconn, "mail") == 3
    assert queue_row(conn, "mail") is None
    assert count_jobs(conn, "queue = 'mail'") == 0
    events = conn.execute(
        "SELECT count(*) FROM jobsd.all_job_events WHERE job_id = ANY(%s)", (gone,)
    ).fetchone()
    assert events == (0,)
    assert count_jobs(conn, "id = ANY(%s)", kept) == 2
    assert [q.name for q in await list_queues(aconn)] == ["default", "other"]
    with pytest.raises(UnknownQueue):
        await drop_queue(aconn, "mail")
    # an empty queue drops too, and a dropped name can be declared again
    await create_queue(aconn, "empty")
    assert await drop_queue(aconn, "empty") == 0
    await create_queue(aconn, "mail")
    assert (await get_queue(aconn, "mail")).open_jobs == 0


@pytest.mark.anyio
async def test_the_default_queue_is_never_dropped(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    make_job(conn, queue="default", status="succeeded")
    with pytest.raises(ValueError, match="'default' cannot be dropped"):
        await drop_queue(aconn, "default")
    # nor straight through the database function
    with pytest.raises(psycopg.Error, match="cannot be dropped"):
        conn.execute("SELECT * FROM jobsd.queue_drop('default')")
    assert queue_row(conn, "default") is not None
    assert count_jobs(conn, "queue = 'default'") == 1


async def _blocked_by(admin: psycopg.AsyncConnection[Any], waiter: int, holder: int) -> bool:
    cur = await admin.execute("SELECT %s = ANY(pg_blocking_pids(%s))", (holder, waiter))
    row = await cur.fetchone()
    return bool(row and row[0])


async def _run_behind(
    admin: psycopg.AsyncConnection[Any],
    holder: psycopg.AsyncConnection[Any],
    waiter: psycopg.AsyncConnection[Any],
    act: Callable[[], Awaitable[Any]],
    refusal: type[BaseException],
    what: str,
) -> dict[str, Any]:
    """Run ``act`` on ``waiter`` while ``holder``'s transaction is open: check that it
    waits for ``holder``'s lock, commit ``holder``, and return ``{"done": its value}``
    or ``{"refused": the error}`` (of type ``refusal``)."""
    outcome: dict[str, Any] = {}

    async def run() -> None:
        try:
            outcome["done"] = await act()
        except refusal as exc:
            outcome["refused"] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await wait_until(
            lambda: _blocked_by(admin, waiter.info.backend_pid, holder.info.backend_pid),
            what=what,
        )
        assert outcome == {}
        await holder.commit()
    return outcome


@pytest.mark.anyio
@pytest.mark.parametrize("by", ["queue_drop", "a raw DELETE"])
async def test_a_drop_after_an_uncommitted_enqueue_waits_for_it_then_refuses(
    db_url: str, aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any], by: str
) -> None:
    """Through jobsd's queue_drop, or a DELETE of the queue row by hand (refused by the
    foreign key jobs_queue_fkey): either waits for the enqueue in flight, then refuses."""
    await create_queue(aconn, "mail")
    client = Client(db_url)
    async with (
        await psycopg.AsyncConnection.connect(db_url) as enqueuer,
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) as dropper,
    ):
        job = await client.enqueue("t", {}, org_id="acme", queue="mail", conn=enqueuer)
        if by == "queue_drop":
            drop, refusal = lambda: drop_queue(dropper, "mail"), QueueNotEmpty
        else:
            drop = lambda: dropper.execute("DELETE FROM jobsd.queues WHERE name = 'mail'")  # noqa: E731
            refusal = psycopg.errors.ForeignKeyViolation
        outcome = await _run_behind(
            aconn, enqueuer, dropper, drop, refusal, "the drop to wait for the enqueue's lock"
        )
    assert "done" not in outcome
    if by == "queue_drop":
        assert outcome["refused"].open_jobs == 1
    else:
        assert outcome["refused"].diag.constraint_name == "jobs_queue_fkey"
    assert queue_row(conn, "mail") is not None
    assert count_jobs(conn, "id = %s", job.id) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("capacity", [None, 5])
async def test_an_enqueue_after_an_uncommitted_drop_fails_with_unknown_queue(
    db_url: str,
    aconn: psycopg.AsyncConnection[Any],
    conn: psycopg.Connection[Any],
    capacity: int | None,
) -> None:
    # with a capacity the admission takes the queue row too; without one the foreign
    # key's check is what waits
    await create_queue(aconn, "mail", capacity=capacity)
    make_job(conn, queue="mail", status="succeeded")
    client = Client(db_url)
    async with (
        await psycopg.AsyncConnection.connect(db_url) as dropper,
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) as enqueuer,
    ):
        assert await drop_queue(dropper, "mail") == 1  # not committed yet: the row is locked
        outcome = await _run_behind(
            aconn,
            dropper,
            enqueuer,
            lambda: client.enqueue("t", {}, org_id="acme", queue="mail", conn=enqueuer),
            UnknownQueue,
            "the enqueue to wait for the drop's lock",
        )
    assert "done" not in outcome
    assert outcome["refused"].queue == "mail"
    assert queue_row(conn, "mail") is None
    assert count_jobs(conn, "queue = 'mail'") == 0


@pytest.mark.anyio
async def test_the_client_methods_delegate(db_url: str, conn: psycopg.Connection[Any]) -> None:
    async with Client(db_url) as client:
        created = await client.create_queue("mail", capacity=4, retention_days=2)
        assert (created.capacity, created.retention_days) == (4, 2)
        with pytest.raises(QueueExists):
            await client.create_queue("mail")
        changed = await client.set_queue_limits("mail", capacity=None, concurrency_limit=2)
        assert (changed.capacity, changed.concurrency_limit, changed.retention_days) == (
            None,
            2,
            2,
        )
        assert (await client.pause_queue("mail")).paused
        assert [(q.name, q.paused) for q in await client.list_queues()] == [
            ("default", False),
            ("mail", True),
        ]
        assert not (await client.resume_queue("mail")).paused
        await client.enqueue("t", {}, org_id="acme", queue="mail")
        with pytest.raises(QueueNotEmpty):
            await client.drop_queue("mail")
        conn.execute("UPDATE jobsd.jobs SET status = 'cancelled', finished_at = now()")
        assert await client.drop_queue("mail") == 1
        with pytest.raises(UnknownQueue):
            await client.pause_queue("mail")


@pytest.mark.anyio
async def test_a_repeatable_read_enqueue_into_a_queue_dropped_since_its_snapshot_fails(
    db_url: str, aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    await create_queue(aconn, "mail")
    client = Client(db_url)
    async with await psycopg.AsyncConnection.connect(db_url) as enqueuer:
        await enqueuer.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await enqueuer.execute("SELECT 1")  # the snapshot: the queue exists in it
        assert await drop_queue(aconn, "mail") == 0
        await aconn.commit()
        with pytest.raises((UnknownQueue, JobsdError)) as caught:
            await client.enqueue("t", {}, org_id="acme", queue="mail", conn=enqueuer)
        await enqueuer.rollback()
    cause = caught.value.__cause__
    assert isinstance(
        cause, psycopg.errors.SerializationFailure | psycopg.errors.ForeignKeyViolation
    )
    assert count_jobs(conn, "queue = 'mail'") == 0


def test_raw_sql_cannot_leave_a_job_in_a_queue_that_does_not_exist(
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute("INSERT INTO jobsd.queues (name) VALUES ('mail'), ('sms')")
    job_id = make_job(conn, queue="mail", status="queued")
    refusals = [
        "INSERT INTO jobsd.jobs (org_id, type, queue) VALUES ('acme', 't', 'nope')",
        "INSERT INTO jobsd.jobs (org_id, type, queue)"
        " VALUES ('acme', 't', 'mail'), ('acme', 't', 'nope')",
        "UPDATE jobsd.jobs SET queue = 'nope' WHERE queue = 'mail'",
        "DELETE FROM jobsd.queues WHERE name = 'mail'",
        "UPDATE jobsd.queues SET name = 'post' WHERE name = 'mail'",
    ]
    details = []
    for statement in refusals:
        with pytest.raises(psycopg.errors.ForeignKeyViolation) as caught, conn.transaction():
            conn.execute(statement)
        assert caught.value.diag.constraint_name == "jobs_queue_fkey", statement
        details.append(caught.value.diag.message_detail)
    # the foreign key's own wording, which UnknownQueue reads the queue's name from
    assert details[:3] == ['Key (queue)=(nope) is not present in table "queues".'] * 3
    assert details[3:] == ['Key (name)=(mail) is still referenced from table "jobs".'] * 2
    assert count_jobs(conn, "queue = 'nope'") == 0
    assert queue_row(conn, "mail") is not None
    # what the foreign key allowed stays allowed
    conn.execute("UPDATE jobsd.jobs SET queue = 'sms' WHERE id = %s", (job_id,))
    conn.execute("UPDATE jobsd.queues SET name = name, capacity = 3 WHERE name = 'mail'")
    conn.execute("DELETE FROM jobsd.queues WHERE name = 'mail'")  # no job names it now
    assert queue_row(conn, "mail") is None
