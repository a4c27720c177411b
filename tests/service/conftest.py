"""Fixtures of the service tests: daemons run in-process on the test's own database.

Every test gets a fresh migrated database (``db_url``), its own ``Registry`` and short
intervals, so a whole scenario takes well under a second of daemon time. Tests wait on
events or poll the database against a deadline, never on a bare sleep.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import psycopg
import pytest
from daemonkit import running_daemon as running_daemon
from daemonkit import wait_until as wait_until
from psycopg.rows import DictRow, dict_row

import jobsd
from jobsd.registry import Registry
from jobsd.settings import Settings

T = TypeVar("T")
ADb = psycopg.AsyncConnection[DictRow]

# Fast enough that a scenario is quick, slow enough not to spin two cores.
FAST: dict[str, Any] = {
    "slots": 4,
    "poll_interval": 0.5,
    "stale_after": 600.0,
    "heartbeat_interval": 0.2,
    "progress_interval": 0.05,
    "sweep_interval": 3600.0,
    "drain_timeout": 2.0,
    "notify": True,
    "handlers": [],
    "queues": [],
}


def make_settings(db_url: str, **overrides: Any) -> Settings:
    """Return daemon settings for ``db_url`` with the fast test intervals."""
    return Settings(database_url=db_url, **{**FAST, **overrides})


async def fetch_job(db: ADb, job_id: uuid.UUID) -> dict[str, Any]:
    """Read one row of jobsd.jobs."""
    cur = await db.execute("SELECT * FROM jobsd.jobs WHERE id = %s", (job_id,))
    row = await cur.fetchone()
    assert row is not None, f"job {job_id} not found"
    return row


async def wait_status(
    db: ADb, job_id: uuid.UUID, *statuses: str, timeout_s: float = 10.0
) -> dict[str, Any]:
    """Wait until a job is in one of ``statuses``; return its row."""

    async def check() -> dict[str, Any] | None:
        row = await fetch_job(db, job_id)
        return row if row["status"] in statuses else None

    return await wait_until(
        check, what=f"job {job_id} to be {'/'.join(statuses)}", timeout_s=timeout_s
    )


async def events_of(db: ADb, job_id: uuid.UUID) -> list[tuple[str | None, str, int, str | None]]:
    """Return a job's history as (from, to, attempt, reason), oldest first."""
    cur = await db.execute(
        "SELECT from_status, to_status, attempt, reason FROM jobsd.job_events "
        "WHERE job_id = %s ORDER BY id",
        (job_id,),
    )
    return [
        (r["from_status"], r["to_status"], r["attempt"], r["reason"]) for r in await cur.fetchall()
    ]


@pytest.fixture
def anyio_backend() -> str:
    """Run the async tests on asyncio, the loop the daemon runs on in production."""
    return "asyncio"


@pytest.fixture
def registry() -> Registry:
    """Return an empty handler registry of the test's own."""
    return Registry()


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[ADb]:
    """Open an async autocommit connection (dict rows) to the test's database."""
    conn = await psycopg.AsyncConnection.connect(db_url, autocommit=True, row_factory=dict_row)
    async with conn:
        yield conn


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[jobsd.Client]:
    """Return an async client on the test's database."""
    async with jobsd.Client(db_url) as c:
        yield c
