"""A plain enqueue writes less (migration 0033): running jobs have an index of their own
(a queued job enters none but the key's, the claim's and the lists'), the queue depth
counts each state, and the after-insert trigger still refuses and stores what it did."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbcheck import claim_one, insert_job

pytestmark = pytest.mark.anyio

AConn = psycopg.AsyncConnection[Any]
Conn = psycopg.Connection[Any]

# the entries of each index of jobs, live or dead (a tiny index: its one leaf page; an
# empty one has its meta page only)
INDEX_ENTRIES = """
SELECT c.relname AS index,
       CASE WHEN pg_relation_size(c.oid) > current_setting('block_size')::int
            THEN (SELECT count(*) FROM bt_page_items('jobsd.' || c.relname, 1)) ELSE 0 END
FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid = 'jobsd.jobs'::regclass ORDER BY c.relname
"""


def _entries(conn: Conn) -> dict[str, int]:
    conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
    return {r[0]: r[1] for r in conn.execute(INDEX_ENTRIES).fetchall()}


async def test_a_queued_job_enters_no_state_index_a_running_one_the_running_index(
    conn: Conn, aconn: AConn
) -> None:
    empty = _entries(conn)
    await insert_job(aconn)
    queued = _entries(conn)
    entered = {name for name, n in queued.items() if n > empty[name]}
    assert entered == {
        "jobs_pkey",
        "jobs_claim_v2_idx",
        "jobs_created_idx",
        "jobs_org_created_idx",
        "jobs_open_by_queue_org_idx",
    }
    await claim_one(aconn, worker_id="w7")
    running = _entries(conn)
    assert running["jobs_running_idx"] == 1
    conn.execute("SET enable_seqscan = off")
    plan = conn.execute(
        "EXPLAIN (FORMAT JSON) SELECT id FROM jobsd.jobs WHERE status = 'running' AND "
        "worker_id = 'w7'",
    ).fetchone()
    assert plan is not None and "jobs_running_idx" in str(plan[0])


async def test_the_queue_depth_counts_each_state_of_each_queue(conn: Conn, aconn: AConn) -> None:
    conn.execute("INSERT INTO jobsd.queues (name) VALUES ('mail')")
    for _ in range(3):
        await insert_job(aconn)
    await insert_job(aconn, queue="mail")
    await insert_job(aconn, queue="mail", run_after=datetime.now(UTC) + timedelta(hours=1))
    await claim_one(aconn)  # default: oldest first
    stuck = await insert_job(aconn, queue="mail")
    conn.execute(
        "UPDATE jobsd.jobs SET status = 'running', lease_id = gen_random_uuid() WHERE id = %s",
        (stuck,),
    )
    conn.execute(
        "UPDATE jobsd.jobs SET status = 'recovery_required' WHERE id = %s",
        (stuck,),
    )
    rows = conn.execute("SELECT queue, status, jobs FROM jobsd.queue_depth_v2()").fetchall()
    depth = {(q, s): n for q, s, n in rows}
    assert depth == {
        ("default", "queued"): 2,
        ("default", "running"): 1,
        ("default", "scheduled"): 0,
        ("default", "recovery_required"): 0,
        ("mail", "queued"): 1,
        ("mail", "running"): 0,
        ("mail", "scheduled"): 1,
        ("mail", "recovery_required"): 1,
    }


async def test_the_trigger_still_refuses_a_started_insert_and_stores_a_scheduled_one(
    conn: Conn, aconn: AConn
) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match="a job starts queued"):
        conn.execute(
            "INSERT INTO jobsd.jobs (org_id, type, status) VALUES ('acme', 't', 'running')"
        )
    with pytest.raises(psycopg.errors.CheckViolation, match="a job starts queued"):
        conn.execute(
            "INSERT INTO jobsd.jobs (org_id, type, start_event_id) VALUES ('acme', 't', 1)"
        )
    await insert_job(aconn)
    later = await insert_job(aconn, run_after=datetime.now(UTC) + timedelta(hours=1))
    stored = conn.execute("SELECT job_id, from_status, to_status FROM jobsd.job_events").fetchall()
    assert stored == [(later, None, "scheduled")]
    assert conn.execute("SELECT count(*) FROM jobsd.jobs").fetchone() == (2,)
