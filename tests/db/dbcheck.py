"""Helpers of the database tests: read rows, history and notifications back."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from support.jobs import job_row as job_row

from jobsd.client import JobSpec
from jobsd.models import Job
from jobsd.store import queries

# The channel of jobsd's wake-ups, and a payload no queue can have (see queues_name_check).
CHANNEL = "jobsd"
FENCE = "!fence"


def count_jobs(conn: psycopg.Connection[Any], where: str = "true", *args: Any) -> int:
    """Count rows of jobsd.jobs matching a condition written by the test."""
    row = conn.execute(f"SELECT count(*) FROM jobsd.jobs WHERE {where}", args).fetchone()
    assert row is not None
    return int(row[0])


def history(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> list[tuple[Any, ...]]:
    """Return a job's events as (from, to, attempt, worker, reason), oldest first."""
    return conn.execute(
        "SELECT from_status, to_status, attempt, worker_id, reason FROM jobsd.all_job_events "
        "WHERE job_id = %s ORDER BY id",
        (job_id,),
    ).fetchall()


class Listener:
    """A connection LISTENing on jobsd's channel that counts what a block of work sends.

    ``collect()`` sends a fence notification from ``sender`` and reads until it arrives:
    Postgres delivers notifications in commit order, so everything committed before
    the fence has been received by then. No sleeping, no timing guesses.
    """

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(f"LISTEN {CHANNEL}")

    def collect(self, sender: psycopg.Connection[Any]) -> list[str]:
        """Return the payloads received since the last call, in order."""
        sender.execute("SELECT pg_notify(%s, %s)", (CHANNEL, FENCE))
        got: list[str] = []
        for note in self.conn.notifies(timeout=10.0):
            if note.payload == FENCE:
                return got
            got.append(note.payload)
        raise AssertionError(f"the fence notification never arrived (got {got})")

    def close(self) -> None:
        self.conn.close()


async def insert_job(aconn: psycopg.AsyncConnection[Any], **options: Any) -> uuid.UUID:
    """Insert one job of type ``t`` for org ``acme`` with jobsd's insert; return its id."""
    spec = JobSpec.build("t", {}, org_id="acme", **options)
    await queries.run_named(aconn, "jobs_insert", spec.insert_params())
    return spec.id


async def claim_one(aconn: psycopg.AsyncConnection[Any], worker_id: str = "w1") -> Job:
    """Claim the next job with jobsd's claim, as worker ``worker_id``, and start it."""
    (run,) = await queries.claim_batch(
        aconn, limit=1, worker_id=worker_id, queues=None, keep_dedup_types=[], free=1
    )
    return run
