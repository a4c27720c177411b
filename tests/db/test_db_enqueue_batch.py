"""The batch enqueue (``Client.enqueue_batch``): plain payloads in, ids out, through one
INSERT below ``BATCH_COPY_MIN_JOBS`` jobs and one COPY from there. Both ways store
what the ids name, refuse what a one-job enqueue refuses, name the bad payload's
position, and leave nothing behind when they refuse."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbcheck import Listener, count_jobs
from pydantic import BaseModel

from jobsd import Client, JobStatus, QueueFull, UnknownQueue
from jobsd.errors import InvalidPayload, PayloadTooLarge
from jobsd.store import enqueue_batch as store_batch
from jobsd.store.enqueue_batch import BATCH_COPY_MIN_JOBS

pytestmark = pytest.mark.anyio

SIZES = pytest.mark.parametrize("size", [3, BATCH_COPY_MIN_JOBS], ids=["insert", "copy"])

# Text that COPY's text format must escape, and text it must not touch.
AWKWARD = 'tab\there, newline\nthere, back\\slash, \\N, \r, é, 😀, "quoted", \\\\u0000'


class Point(BaseModel):
    x: int


@SIZES
async def test_a_batch_stores_the_jobs_its_ids_name(
    size: int, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("INSERT INTO jobsd.queues (name) VALUES ('mail-q')")
    payloads: list[dict[str, Any] | BaseModel | None] = [
        {"i": i, "text": AWKWARD} for i in range(size - 2)
    ]
    payloads += [None, Point(x=7)]
    async with Client(db_url) as client:
        ids = await client.enqueue_batch(
            "send\\mail", payloads, org_id="org\t1", queue="mail-q", priority=-3
        )
        jobs = [await client.get(i) for i in ids]

    assert len(ids) == size and len(set(ids)) == size
    assert ids == sorted(ids)  # UUIDv7, increasing: claimed in batch order
    assert all(isinstance(i, uuid.UUID) and i.version == 7 for i in ids)
    assert [j.payload for j in jobs] == [{"i": i, "text": AWKWARD} for i in range(size - 2)] + [
        {},
        {"x": 7},
    ]
    assert {(j.type, j.org_id, j.queue, j.priority, j.status) for j in jobs} == {
        ("send\\mail", "org\t1", "mail-q", -3, JobStatus.QUEUED)
    }
    assert len({j.created_at for j in jobs}) == 1  # one statement


@SIZES
async def test_a_batch_goes_in_the_way_its_size_says(
    size: int, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    real = store_batch.copy_text

    def noted(batch: Any) -> str:
        ran.append("copy")
        return real(batch)

    monkeypatch.setattr(store_batch, "copy_text", noted)
    async with Client(db_url) as client:
        await client.enqueue_batch("t", [{}] * size, org_id="o")
    assert ran == ([] if size < BATCH_COPY_MIN_JOBS else ["copy"])


@SIZES
async def test_a_batch_with_a_start_time_is_scheduled(
    size: int, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    soon = datetime.now(UTC) + timedelta(hours=1)
    async with Client(db_url) as client:
        ids = await client.enqueue_batch("t", [{}] * size, org_id="o", run_after=soon)
    rows = conn.execute(
        "SELECT status, run_after FROM jobsd.jobs WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    assert rows == [("scheduled", soon)] * size


@SIZES
async def test_a_batch_into_an_unknown_queue_creates_nothing(
    size: int, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with Client(db_url) as client:
        with pytest.raises(UnknownQueue, match="nope"):
            await client.enqueue_batch("t", [{}] * size, org_id="o", queue="nope")
    assert count_jobs(conn) == 0


@SIZES
async def test_a_batch_past_a_queues_capacity_creates_nothing(
    size: int, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("INSERT INTO jobsd.queues (name, capacity) VALUES ('small', %s)", (size,))
    async with Client(db_url) as client:
        with pytest.raises(QueueFull):
            await client.enqueue_batch("t", [{}] * (size + 1), org_id="o", queue="small")
        assert count_jobs(conn) == 0
        assert len(await client.enqueue_batch("t", [{}] * size, org_id="o", queue="small")) == size
    assert count_jobs(conn) == size


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"s": "a\x00b"}, "payload 2 contains a NUL character"),
        ({"s": "\ud800"}, "payload 2 contains a lone surrogate"),
        ({"when": object()}, "payload 2 is not JSON-serializable"),
        (["not", "an", "object"], "payload 2 must be a JSON object, not list"),
        ({"x": float("nan")}, "payload 2 is not valid JSON"),
    ],
    ids=["nul", "surrogate", "unserializable", "not-an-object", "nan"],
)
@SIZES
async def test_a_bad_payload_is_named_by_its_position_and_nothing_is_created(
    size: int, bad: Any, message: str, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    payloads = [{"i": i} for i in range(size)]
    payloads[2] = bad
    async with Client(db_url) as client:
        with pytest.raises(InvalidPayload, match=message):
            await client.enqueue_batch("t", payloads, org_id="o")
    assert count_jobs(conn) == 0


@SIZES
async def test_a_payload_over_the_limit_is_refused_before_any_sql(
    size: int, db_url: str, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBSD_MAX_PAYLOAD_BYTES", "1000")
    payloads = [{"i": i} for i in range(size)]
    payloads[-1] = {"blob": "é" * 400}  # 400 characters, 800 bytes of UTF-8: under
    async with Client(db_url) as client:
        assert len(await client.enqueue_batch("t", payloads, org_id="o")) == size
        payloads[1] = {"blob": "é" * 600}  # 1,200 bytes
        with pytest.raises(PayloadTooLarge, match="payload 1 is 1211 bytes"):
            await client.enqueue_batch("t", payloads, org_id="o")
    assert count_jobs(conn) == size


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"type": ""}, "job type"),
        ({"org_id": "a\x00"}, "org_id must not contain NUL"),
        ({"queue": "q\x00"}, "queue must not contain NUL"),
        ({"priority": 10**7}, "priority must be an integer"),
        ({"run_after": datetime(2030, 1, 1)}, "timezone-aware"),
    ],
)
async def test_bad_batch_options_are_refused_before_any_sql(
    options: dict[str, Any], message: str, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    args: dict[str, Any] = {"type": "t", "org_id": "o", **options}
    async with Client(db_url) as client:
        with pytest.raises(ValueError, match=message):
            await client.enqueue_batch(payloads=[{}], **args)
    assert count_jobs(conn) == 0


async def test_an_empty_batch_returns_no_ids(db_url: str, conn: psycopg.Connection[Any]) -> None:
    async with Client(db_url) as client:
        assert await client.enqueue_batch("t", [], org_id="o") == []
    assert count_jobs(conn) == 0


@SIZES
async def test_a_batch_wakes_listeners_of_its_queue(
    size: int, db_url: str, conn: psycopg.Connection[Any], listener: Callable[[], Listener]
) -> None:
    watch = listener()
    async with Client(db_url) as client:
        await client.enqueue_batch("t", [{}] * size, org_id="o")
    assert watch.collect(conn) == ["default"]
