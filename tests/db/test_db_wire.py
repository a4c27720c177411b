"""The enqueue's insert on libpq directly (jobsd.store.wire): the same rows, the same
errors as through psycopg, a prepared statement that survives DISCARD ALL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbcheck import job_row

from jobsd import Client, JobStatus, SyncClient
from jobsd.errors import UnknownQueue
from jobsd.settings import Settings
from jobsd.store import wire

pytestmark = pytest.mark.anyio

PREPARED = "jobsd_jobs_insert_v1"


def _client(db_url: str) -> Client:
    return Client(db_url, settings=Settings(database_url=db_url, pool_size=2))


async def _on_every_session(client: Client, statement: str) -> list[list[Any]]:
    """Run ``statement`` on each of the pool's two connections at once; return the rows."""
    async with client._pool.connection() as one, client._pool.connection() as two:
        results = [await c.execute(statement) for c in (one, two)]
        return [await cur.fetchall() if cur.description else [] for cur in results]


async def _enqueue_on_every_session(client: Client, n: int = 4) -> None:
    # both connections open first (the pool opens its second one in the background, late
    # on a busy machine), then the pool hands its idle connections out in turn
    await _on_every_session(client, "SELECT 1")
    for i in range(n):
        await client.enqueue("t", {"i": i}, org_id="o")


PREPARED_NAMES = f"SELECT name FROM pg_prepared_statements WHERE name = '{PREPARED}'"


async def test_an_enqueue_on_the_pool_prepares_the_insert_once_and_returns_the_row(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with _client(db_url) as client:
        first = await client.enqueue("t", {"n": 1}, org_id="o")
        later = datetime.now(UTC) + timedelta(hours=1)
        second = await client.enqueue("t", {"n": 2}, org_id="o", run_after=later, priority=3)
        await _enqueue_on_every_session(client)
        assert await _on_every_session(client, PREPARED_NAMES) == [[{"name": PREPARED}]] * 2
    for job in (first, second):
        row = job_row(conn, job.id)
        assert row is not None
        assert (job.status, job.run_after, job.created_at, job.priority) == (
            row["status"],
            row["run_after"],
            row["created_at"],
            row["priority"],
        )
    assert first.status is JobStatus.QUEUED and second.status is JobStatus.SCHEDULED
    assert second.run_after == later


async def test_the_job_carries_the_sessions_time_zone_as_through_psycopg(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with _client(db_url) as client:
        await _on_every_session(client, "SET TimeZone = 'Asia/Kolkata'")
        job = await client.enqueue("t", {}, org_id="o")
    assert job.created_at.utcoffset() == timedelta(hours=5, minutes=30)
    assert job.created_at == job_row(conn, job.id)["created_at"]  # type: ignore[index]


async def test_the_insert_is_prepared_again_after_discard_all(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with _client(db_url) as client:
        await _enqueue_on_every_session(client)
        await _on_every_session(client, "DISCARD ALL")
        assert await _on_every_session(client, PREPARED_NAMES) == [[], []]
        await _enqueue_on_every_session(client)
        assert await _on_every_session(client, PREPARED_NAMES) == [[{"name": PREPARED}]] * 2
    assert conn.execute("SELECT count(*) FROM jobsd.jobs").fetchone() == (8,)


async def test_database_errors_are_the_same_as_through_psycopg(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with _client(db_url) as client:
        with pytest.raises(UnknownQueue):
            await client.enqueue("t", {}, org_id="o", queue="nowhere")
        # a NUL is refused before any SQL, whichever path the insert would take
        with pytest.raises(ValueError, match="dedup_key must not contain NUL"):
            await client.enqueue("t", {}, org_id="o", dedup_key="a\x00b")
        ok = await client.enqueue("t", {}, org_id="o", dedup_key="a")
        again = await client.enqueue("t", {}, org_id="o", dedup_key="a")
    assert again.id == ok.id
    assert conn.execute("SELECT count(*) FROM jobsd.jobs").fetchone() == (1,)


async def test_a_connection_not_idle_or_an_unknown_parameter_goes_through_psycopg(
    aconn: psycopg.AsyncConnection[Any],
) -> None:
    params = {
        "id": uuid.uuid4(),
        "org_id": "o",
        "type": "t",
        "queue": "default",
        "dedup_key": None,
        "payload": "{}",
        "run_after": None,
        "priority": 0,
        "concurrency_key": None,
        "trace_context": None,
        "blocked": False,
    }
    async with aconn.transaction():
        assert await wire.run_jobs_insert(aconn, params) is None
    assert await wire.run_jobs_insert(aconn, {**params, "priority": 1.5}) is None
    assert await wire.run_jobs_insert(aconn, {**params, "run_after": datetime(2030, 1, 1)}) is None
    rows = await wire.run_jobs_insert(aconn, params)
    assert rows is not None and [r["id"] for r in rows] == [params["id"]]
    # the same id again: ON CONFLICT DO NOTHING, no row
    assert await wire.run_jobs_insert(aconn, params) == []


def test_the_sync_client_takes_the_same_path(db_url: str, conn: psycopg.Connection[Any]) -> None:
    with SyncClient(db_url, settings=Settings(database_url=db_url, pool_size=2)) as client:
        pool = client._pool

        def on_every_session(statement: str) -> list[list[Any]]:
            with pool.connection() as one, pool.connection() as two:
                results = [c.execute(statement) for c in (one, two)]
                return [cur.fetchall() if cur.description else [] for cur in results]

        jobs = [client.enqueue("t", {"i": i}, org_id="o") for i in range(4)]
        assert on_every_session(PREPARED_NAMES) == [[{"name": PREPARED}]] * 2
        on_every_session("DISCARD ALL")
        jobs += [client.enqueue("t", {"i": i}, org_id="o") for i in range(4, 8)]
        assert on_every_session(PREPARED_NAMES) == [[{"name": PREPARED}]] * 2
        with pytest.raises(UnknownQueue):
            client.enqueue("t", {}, org_id="o", queue="nowhere")
    for job in jobs:
        row = job_row(conn, job.id)
        assert row is not None
        assert (job.status, job.created_at, job.payload) == (
            row["status"],
            row["created_at"],
            row["payload"],
        )


async def test_a_dropped_connection_under_the_insert_is_retried_and_creates_one_job(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with _client(db_url) as client:
        await _enqueue_on_every_session(client)
        killed = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'jobsd-client' AND datname = current_database()"
        ).fetchone()
        assert killed == (2,)
        job = await client.enqueue("t", {"after": "kill"}, org_id="o")
        # that re-sent insert held its id in a transaction (an ended job with that id
        # may have moved to the archive): the next one takes the fast path again
        await client.enqueue("t", {"after": "resent"}, org_id="o")
        assert await _on_every_session(client, PREPARED_NAMES) in (
            [[{"name": PREPARED}], []],
            [[], [{"name": PREPARED}]],
            [[{"name": PREPARED}]] * 2,
        )
    assert conn.execute(
        'SELECT count(*) FROM jobsd.jobs WHERE payload = \'{"after": "kill"}\''
    ).fetchone() == (1,)
    assert job_row(conn, job.id) is not None
