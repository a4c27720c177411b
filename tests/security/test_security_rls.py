"""Row-level security: a role without the all-orgs policy sees the org in jobsd.org_id only."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from support.jobs import make_job

from jobsd.client import JobSpec
from jobsd.store import queries

from .conftest import Roles


def _insert(conn: psycopg.Connection[Any], org_id: str) -> str:
    spec = JobSpec.build("t", {"n": 1}, org_id=org_id)
    rows = queries.run_named_sync(conn, "jobs_insert", spec.insert_params())
    return str(rows[0]["id"])


@pytest.fixture
def jobs_by_org(roles: Roles) -> dict[str, set[str]]:
    """Two jobs of org a, one of org b, one with an empty org: inserted by the superuser."""
    with psycopg.connect(roles.db_url, autocommit=True) as conn:
        empty = make_job(conn, org_id="")
        return {
            "a": {_insert(conn, "a"), _insert(conn, "a")},
            "b": {_insert(conn, "b")},
            "": {str(empty)},
        }


def _unfiltered(conn: psycopg.Connection[Any]) -> tuple[dict[str, str], list[str]]:
    """Run the deliberately unfiltered reads: job id -> org, and the orgs of all events."""
    with conn.cursor(row_factory=dict_row) as cur:
        jobs = {str(r["id"]): r["org_id"] for r in cur.execute("SELECT * FROM jobsd.jobs")}
        events = [r["org_id"] for r in cur.execute("SELECT * FROM jobsd.all_job_events")]
    return jobs, events


def test_reader_sees_only_the_org_set_and_nothing_without_one(
    roles: Roles, jobs_by_org: dict[str, set[str]]
) -> None:
    with psycopg.connect(roles.url("read"), autocommit=True) as conn:
        # never set in this session: current_setting(..., true) is NULL
        assert _unfiltered(conn) == ({}, [])

        conn.execute("SET jobsd.org_id = 'a'")
        jobs, events = _unfiltered(conn)
        assert set(jobs) == jobs_by_org["a"] and set(jobs.values()) == {"a"}
        assert events == ["a", "a"]

        conn.execute("SET jobsd.org_id = 'b'")
        jobs, events = _unfiltered(conn)
        assert set(jobs) == jobs_by_org["b"] and events == ["b"]

        # set and reset: the setting exists but is empty; the job with org '' stays hidden
        conn.execute("RESET jobsd.org_id")
        assert _unfiltered(conn) == ({}, [])
        conn.execute("SET jobsd.org_id = ''")
        assert _unfiltered(conn) == ({}, [])

        # a count, a lookup by id and a join leak nothing either
        (count,) = conn.execute("SELECT count(*) FROM jobsd.jobs").fetchone() or (None,)
        assert count == 0
        (b_id,) = jobs_by_org["b"]
        assert conn.execute("SELECT 1 FROM jobsd.jobs WHERE id = %s", (b_id,)).fetchall() == []

        # transaction-local, the way an application scopes one request
        with conn.transaction():
            conn.execute("SELECT set_config('jobsd.org_id', 'a', true)")
            assert set(_unfiltered(conn)[0]) == jobs_by_org["a"]
        assert _unfiltered(conn) == ({}, [])


def test_reader_with_the_org_in_its_connection_options(
    roles: Roles, jobs_by_org: dict[str, set[str]]
) -> None:
    with psycopg.connect(roles.url("read", org="b"), autocommit=True) as conn:
        jobs, events = _unfiltered(conn)
    assert set(jobs) == jobs_by_org["b"] and events == ["b"]


def test_owner_worker_and_superuser_see_every_org(
    roles: Roles, jobs_by_org: dict[str, set[str]]
) -> None:
    everything = set().union(*jobs_by_org.values())
    for url in (roles.url("owner"), roles.db_url):
        with psycopg.connect(url, autocommit=True) as conn:
            jobs, events = _unfiltered(conn)
        assert set(jobs) == everything, url
        assert sorted(events) == ["", "a", "a", "b"], url
    # the worker reads jobs only (it writes events through the trigger, never reads them)
    with psycopg.connect(roles.url("worker"), autocommit=True) as conn:
        rows = conn.execute("SELECT id::text FROM jobsd.jobs").fetchall()
    assert {r[0] for r in rows} == everything


def test_enqueuer_writes_and_reads_only_its_org(
    roles: Roles, jobs_by_org: dict[str, set[str]]
) -> None:
    (b_id,) = jobs_by_org["b"]
    with psycopg.connect(roles.url("enqueue", org="a"), autocommit=True) as conn:
        new_id = _insert(conn, "a")  # the history trigger writes its event as this role
        jobs, events = _unfiltered(conn)
        assert set(jobs) == jobs_by_org["a"] | {new_id}
        assert events == ["a", "a", "a"]

        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            _insert(conn, "b")
        assert queries.run_named_sync(conn, "jobs_get", {"id": b_id}) == []
        cancelled = queries.run_named_sync(conn, "api_jobs_cancel", {"id": b_id, "org_id": "b"})
        assert cancelled == []

    with psycopg.connect(roles.db_url, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM jobsd.jobs WHERE id = %s", (b_id,)).fetchone()
    assert row == ("queued",)  # org b's job was neither seen nor touched
