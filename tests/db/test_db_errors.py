"""Typed enqueue errors: unknown queue, bad or large payloads, database down."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import psycopg
import pytest
from dbcheck import count_jobs

from jobsd import BackendUnavailable, Client, OutcomeUnknown, SyncClient, UnknownQueue
from jobsd.dev.embedded import EmbeddedPostgres
from jobsd.errors import InvalidPayload, PayloadTooLarge
from jobsd.settings import Settings
from jobsd.store.migrate import migrate_sync


@pytest.fixture
def client(db_url: str) -> Iterator[SyncClient]:
    with SyncClient(db_url, settings=Settings(max_payload_bytes=1000)) as c:
        yield c


def test_unknown_queue_is_refused_and_creates_nothing(
    client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(UnknownQueue, match="'mail'") as info:
        client.enqueue("t", {}, org_id="o", queue="mail")
    assert info.value.queue == "mail"
    assert count_jobs(conn) == 0


def test_unknown_queue_leaves_the_callers_transaction_usable(
    db_url: str, client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(db_url) as caller, caller.transaction():
        with pytest.raises(UnknownQueue):
            client.enqueue("t", {}, org_id="o", queue="mail", conn=caller)
        job = client.enqueue("t", {}, org_id="o", conn=caller)
    assert conn.execute("SELECT id FROM jobsd.jobs").fetchall() == [(job.id,)]


def test_oversized_payload_is_refused_and_creates_nothing(
    client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(PayloadTooLarge, match="over the limit of 1000 bytes"):
        client.enqueue("t", {"blob": "é" * 500}, org_id="o")  # 1000 chars of UTF-8
    assert client.enqueue("t", {"blob": "x" * 900}, org_id="o").payload["blob"] == "x" * 900
    assert count_jobs(conn) == 1


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"x": math.nan}, "not valid JSON"),
        ({"x": [1.0, math.inf]}, "not valid JSON"),
        ({"x": "a\u0000b"}, "NUL"),
        ({"a\u0000": 1}, "NUL"),
        ({"x": "\ud800"}, "lone surrogate"),
        ({"x": {"y": "\udfff!"}}, "lone surrogate"),
        ([1, 2], "must be a JSON object, not list"),
        ("{}", "must be a JSON object, not str"),
        ({"x": object()}, "not JSON-serializable"),
    ],
)
def test_payloads_postgres_would_reject_are_refused_up_front(
    db_url: str, client: SyncClient, conn: psycopg.Connection[Any], payload: Any, message: str
) -> None:
    with psycopg.connect(db_url) as caller, caller.transaction():
        with pytest.raises(InvalidPayload, match=message):
            client.enqueue("t", payload, org_id="o", conn=caller)
        # refused before any SQL: the caller's transaction is not aborted
        assert caller.execute("SELECT 1").fetchone() == (1,)
    assert count_jobs(conn) == 0


def test_text_that_only_looks_like_an_escape_is_accepted(
    client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    payload = {"x": "\\u0000", "y": "\\\\u0000"}
    assert client.enqueue("t", payload, org_id="o").payload == payload
    assert count_jobs(conn) == 1


def test_deeply_nested_payload_is_invalid_not_a_crash(client: SyncClient) -> None:
    payload: dict[str, Any] = {}
    inner = payload
    for _ in range(5000):
        inner["a"] = {}
        inner = inner["a"]
    with pytest.raises(InvalidPayload, match="nested more than 64 levels deep"):
        client.enqueue("t", payload, org_id="o")


def test_database_down_is_backend_unavailable_and_no_job_exists(
    make_cluster: Callable[..., EmbeddedPostgres],
) -> None:
    pg = make_cluster()
    url = pg.url("postgres")
    migrate_sync(url)
    job_id = uuid.uuid4()
    pg.stop()

    async def all_at_once() -> list[BaseException]:
        errors: list[BaseException] = []

        async def run_async() -> None:
            async with Client(url) as client:
                try:
                    await client.enqueue("import_csv", {}, org_id="o", queue="default")
                except BaseException as exc:
                    errors.append(exc)

        def run_sync(call: Callable[[SyncClient], object]) -> None:
            with SyncClient(url) as client:
                try:
                    call(client)
                except BaseException as exc:
                    errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_async)
            for call in (
                lambda c: c.enqueue("import_csv", {}, org_id="o", job_id=job_id),
                lambda c: c.get(job_id),
            ):
                tg.start_soon(anyio.to_thread.run_sync, run_sync, call)
        return errors

    started = time.monotonic()
    errors = anyio.run(all_at_once)
    elapsed = time.monotonic() - started

    # answered after one pool timeout (2 s), not after retrying what the pool already retried
    assert elapsed < 5.0

    assert len(errors) == 3
    for exc in errors:
        assert type(exc) is BackendUnavailable, repr(exc)  # not OutcomeUnknown: never sent
        assert not isinstance(exc, OutcomeUnknown)
    messages = sorted(str(e) for e in errors)
    assert messages[0].startswith("enqueue of 'import_csv' into queue 'default' failed")
    assert messages[1].startswith("enqueue of 'import_csv' into queue 'default' failed")
    assert messages[2].startswith(f"read of job {job_id} failed")
    assert all("database unavailable" in m for m in messages)

    pg.start()
    with psycopg.connect(url, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM jobsd.jobs").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM jobsd.all_job_events").fetchone() == (0,)


def test_a_dropped_pooled_connection_is_retried_and_creates_one_job(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    with SyncClient(db_url) as client:
        first = client.enqueue("t", {}, org_id="o")
        killed = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'jobsd-client' AND datname = current_database()"
        ).fetchone()
        assert killed is not None and killed[0] >= 1

        second = client.enqueue("t", {}, org_id="o", dedup_key="k")

    assert second.id != first.id
    assert conn.execute("SELECT id FROM jobsd.jobs ORDER BY id").fetchall() == [
        (first.id,),
        (second.id,),
    ]


def test_a_session_ended_by_the_idle_in_transaction_timeout_is_an_outage(db_url: str) -> None:
    # a transaction left open across a network cut is ended by the server with SQLSTATE
    # 25P03 and the connection closed: that is the database away (retry on a new
    # connection), not a statement refused (which would be logged as a poison error)
    from jobsd.store.db import db_errors

    with psycopg.connect(db_url) as conn:
        conn.execute("SET idle_in_transaction_session_timeout = '50ms'")
        conn.commit()
        conn.execute("SELECT 1")  # a transaction is open and idle now
        deadline = time.monotonic() + 10
        with pytest.raises(BackendUnavailable, match="idle-in-transaction"):
            while time.monotonic() < deadline:
                with db_errors("a statement after the timeout"):
                    conn.execute("SELECT 1")
                time.sleep(0.2)
