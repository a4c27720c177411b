"""Jobs of a pinned age for the retention tests (tests/db/test_db_prune.py, e2e).

A job is made by ``make_job`` (so the triggers write its history) with the timestamps
of its age: a job that finished N days ago was created earlier still, and its id is a
UUIDv7 of that creation time, as the id of a real job of that age would be.
"""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg

from .jobs import NON_TERMINAL as NON_TERMINAL
from .jobs import TERMINAL as TERMINAL
from .jobs import make_job


def v7_at(moment: datetime) -> uuid.UUID:
    """Return a UUIDv7 of ``moment`` (random low bits), as jobsd.uuidv7() would make it."""
    ms = int(moment.timestamp() * 1000)
    rand = int.from_bytes(os.urandom(10), "big") & ((1 << 74) - 1)
    value = (ms << 80) | (0x7 << 76) | ((rand >> 62) << 64) | (0b10 << 62)
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


def make_old_job(
    conn: psycopg.Connection[Any],
    now: datetime,
    *,
    status: str = "succeeded",
    days: float = 100.0,
    queue: str = "default",
    type: str = "t",
    org_id: str = "o",
    job_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """Make a job in ``status`` that finished ``days`` before ``now``; return its id.

    A non-terminal job gets the same old ``created_at`` and a ``finished_at`` too (a
    prune that forgot to check the status would take it). ``job_id`` overrides the
    UUIDv7 of the creation time (a client-chosen id).
    """
    finished = now - timedelta(days=days)
    created = finished - timedelta(minutes=5)
    return make_job(
        conn,
        status=status,
        id=job_id or v7_at(created),
        org_id=org_id,
        type=type,
        queue=queue,
        run_after=now + timedelta(days=1) if status == "scheduled" else created,
        created_at=created,
        started_at=created,
        finished_at=finished,
    )


def set_retention(conn: psycopg.Connection[Any], queue: str, days: int | None) -> None:
    """Declare ``queue`` if needed and set its retention (None: keep forever)."""
    conn.execute(
        "INSERT INTO jobsd.queues (name, retention_days) VALUES (%s, %s)"
        " ON CONFLICT (name) DO UPDATE SET retention_days = EXCLUDED.retention_days",
        (queue, days),
    )


def job_ids(conn: psycopg.Connection[Any]) -> set[uuid.UUID]:
    """Return the ids of every job left."""
    return {row[0] for row in conn.execute("SELECT id FROM jobsd.jobs").fetchall()}


def event_counts(conn: psycopg.Connection[Any]) -> dict[uuid.UUID, int]:
    """Return the number of job_events rows per job id (orphans included)."""
    rows = conn.execute("SELECT job_id, count(*) FROM jobsd.all_job_events GROUP BY job_id")
    return {row[0]: row[1] for row in rows.fetchall()}
