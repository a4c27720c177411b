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
from psycopg.rows import DictRow, dict_row
from support.daemon import DAEMON_FAST
from support.daemon import running_daemon as running_daemon
from support.jobs import fetch_job as fetch_job
from support.waiting import wait_status_async
from support.waiting import wait_until as wait_until

import jobsd
from jobsd.registry import Registry
from jobsd.settings import Settings
from jobsd.store.connect import make_async_pool
from jobsd.store.db import AsyncPool

T = TypeVar("T")
ADb = psycopg.AsyncConnection[DictRow]

# Fast enough that a scenario is quick, slow enough not to spin two cores.
FAST: dict[str, Any] = {**DAEMON_FAST, "stale_after": 600.0, "notify": True}


# the service tests wait on their own loop
wait_status = wait_status_async


def make_settings(db_url: str, **overrides: Any) -> Settings:
    """Return daemon settings for ``db_url`` with the fast test intervals."""
    return Settings(database_url=db_url, **{**FAST, **overrides})


async def events_of(db: ADb, job_id: uuid.UUID) -> list[tuple[str | None, str, int, str | None]]:
    """Return a job's history as (from, to, attempt, reason), oldest first."""
    cur = await db.execute(
        "SELECT from_status, to_status, attempt, reason FROM jobsd.all_job_events "
        "WHERE job_id = %s ORDER BY id",
        (job_id,),
    )
    return [
        (r["from_status"], r["to_status"], r["attempt"], r["reason"]) for r in await cur.fetchall()
    ]


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


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncPool]:
    """Open a small pool on the test's database."""
    pool = make_async_pool(db_url, name="test", min_size=1, max_size=2, timeout_s=5.0)
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()
