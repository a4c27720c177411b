"""The history checker on a real database: a deleted event row is caught.

The checker's rules are tested without a database in tests/unit/test_history_check.py."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from support.history import assert_history_complete

from jobsd.client import SyncClient


def test_a_missing_event_row_in_the_database_is_caught(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    with SyncClient(db_url) as client:
        job = client.enqueue("noop", {}, org_id="acme")
    conn.execute("UPDATE jobsd.jobs SET status = 'running', attempts = 1 WHERE id = %s", (job.id,))
    conn.execute("UPDATE jobsd.jobs SET status = 'succeeded' WHERE id = %s", (job.id,))
    assert assert_history_complete(conn) == 1
    conn.execute(
        "DELETE FROM jobsd.job_events WHERE job_id = %s AND to_status = 'running'", (job.id,)
    )
    with pytest.raises(AssertionError, match="gap"):
        assert_history_complete(conn)
