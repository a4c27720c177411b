"""UUIDv7 ids from the database (jobsd.uuidv7()) and from Python (jobsd.ids.uuid7)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg

from jobsd.ids import uuid7


def _unix_ms(u: uuid.UUID) -> int:
    return u.int >> 80


def _stamp(u: uuid.UUID) -> int:
    """Milliseconds and the 12-bit sub-millisecond fraction, as one number."""
    return ((u.int >> 80) << 12) | ((u.int >> 64) & 0xFFF)


def _assert_v7(ids: list[uuid.UUID]) -> None:
    assert {u.version for u in ids} == {7}
    assert {u.variant for u in ids} == {uuid.RFC_4122}


def test_python_ids_are_v7_strictly_increasing_and_carry_the_clock() -> None:
    before_ms = time.time_ns() // 1_000_000
    ids = [uuid7() for _ in range(20_000)]
    after_ms = time.time_ns() // 1_000_000

    _assert_v7(ids)
    assert len(set(ids)) == len(ids)
    # many ids per millisecond, still in creation order
    assert ids == sorted(ids)
    assert before_ms <= _unix_ms(ids[0]) <= _unix_ms(ids[-1]) <= after_ms + 1


def test_python_ids_stay_increasing_across_threads() -> None:
    per_thread: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def make(out: list[uuid.UUID]) -> None:
        out.extend(uuid7() for _ in range(5_000))

    threads = [threading.Thread(target=make, args=(out,)) for out in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    everything = [u for out in per_thread for u in out]
    assert len(set(everything)) == len(everything)
    for out in per_thread:
        assert out == sorted(out)


def test_database_ids_are_v7_and_time_ordered(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        "SELECT jobsd.uuidv7(), clock_timestamp() FROM generate_series(1, 2000)"
    ).fetchall()
    ids = [r[0] for r in rows]

    _assert_v7(ids)
    assert len(set(ids)) == len(ids)
    stamps = [_stamp(u) for u in ids]
    assert stamps == sorted(stamps)
    for u, at in rows[:: len(rows) // 10]:
        # the id holds the database clock at the call (read again just after it)
        at_ms = int(at.timestamp() * 1000)
        assert 0 <= at_ms - _unix_ms(u) <= 100


def test_database_default_ids_are_v7(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO jobsd.jobs (org_id, type) SELECT 'o', 't' FROM generate_series(1, 50)"
    )
    ids = [r[0] for r in conn.execute("SELECT id FROM jobsd.jobs")]
    _assert_v7(ids)
    assert len(ids) == 50


def test_python_and_database_ids_interleave_in_creation_order(
    conn: psycopg.Connection[Any],
) -> None:
    made: list[uuid.UUID] = []
    for _ in range(300):
        made.append(uuid7())
        row = conn.execute("SELECT jobsd.uuidv7()").fetchone()
        assert row is not None
        made.append(row[0])

    assert made == sorted(made)
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    assert abs(_unix_ms(made[-1]) - now_ms) < 5_000
