"""UUIDv7 ids from the database (jobsd.uuidv7()), and with Python's (jobsd.ids.uuid7).

Python's ids alone are tested in tests/unit/test_ids.py."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
from support.ids import assert_v7, unix_ms
from support.jobs import make_jobs

from jobsd.ids import uuid7


def _stamp(u: uuid.UUID) -> int:
    """Milliseconds and the 12-bit sub-millisecond fraction, as one number."""
    return ((u.int >> 80) << 12) | ((u.int >> 64) & 0xFFF)


def test_database_ids_are_v7_and_time_ordered(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        "SELECT jobsd.uuidv7(), clock_timestamp() FROM generate_series(1, 2000)"
    ).fetchall()
    ids = [r[0] for r in rows]

    assert_v7(ids)
    assert len(set(ids)) == len(ids)
    stamps = [_stamp(u) for u in ids]
    assert stamps == sorted(stamps)
    for u, at in rows[:: len(rows) // 10]:
        # the id holds the database clock at the call (read again just after it)
        at_ms = int(at.timestamp() * 1000)
        assert 0 <= at_ms - unix_ms(u) <= 100


def test_database_default_ids_are_v7(conn: psycopg.Connection[Any]) -> None:
    make_jobs(conn, 50)
    ids = [r[0] for r in conn.execute("SELECT id FROM jobsd.jobs")]
    assert_v7(ids)
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
    assert abs(unix_ms(made[-1]) - now_ms) < 5_000
