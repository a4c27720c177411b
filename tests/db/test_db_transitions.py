"""The state machine is enforced by the database (migration 0005): every pair of
states is tried, only the edges of docs/states.md pass, and they match the Python table."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import psycopg
import pytest
from support.jobs import make_job

from jobsd.models import INITIAL_STATES, TRANSITIONS, JobStatus


def job_in(conn: psycopg.Connection[Any], state: JobStatus) -> uuid.UUID:
    """Insert a job and walk it to ``state``."""
    return make_job(conn, status=str(state))


def test_only_the_edges_of_the_machine_pass(conn: psycopg.Connection[Any]) -> None:
    # every ordered pair of distinct states, each on a job of its own (one database)
    change = "UPDATE jobsd.jobs SET status = %s WHERE id = %s"
    passed = 0
    for before, after in itertools.permutations(JobStatus, 2):
        job_id = job_in(conn, before)
        if after in TRANSITIONS[before]:
            conn.execute(change, (after, job_id))
            last = conn.execute(
                "SELECT from_status, to_status FROM jobsd.all_job_events WHERE job_id = %s "
                "ORDER BY id DESC LIMIT 1",
                (job_id,),
            ).fetchall()
            assert last == [(str(before), str(after))]
            passed += 1
        else:
            with pytest.raises(psycopg.errors.CheckViolation, match="illegal transition"):
                conn.execute(change, (after, job_id))
            status = conn.execute("SELECT status FROM jobsd.jobs WHERE id = %s", (job_id,))
            assert status.fetchone() == (str(before),), f"{before} -> {after}"
    assert passed == sum(len(v) for v in TRANSITIONS.values()) == 18


def test_the_python_table_is_the_database_table(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        "SELECT a, b, jobsd.transition_allowed(a, b) FROM unnest(%(s)s::text[]) AS a, "
        "unnest(%(s)s::text[]) AS b WHERE a <> b",
        {"s": [str(s) for s in JobStatus]},
    ).fetchall()
    assert len(rows) == 56
    for a, b, allowed in rows:
        assert allowed == (JobStatus(b) in TRANSITIONS[JobStatus(a)]), (a, b)


@pytest.mark.parametrize("state", sorted(set(JobStatus) - INITIAL_STATES), ids=str)
def test_a_job_cannot_be_born_past_its_start(conn: psycopg.Connection[Any], state: str) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match="illegal transition"):
        conn.execute(
            "INSERT INTO jobsd.jobs (org_id, type, status) VALUES ('o', 't', %s)", (state,)
        )
