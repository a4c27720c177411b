"""Dedup keys (unique per org), client job ids, and the re-insert when the holder lets go.

The race is driven deterministically: the enqueue plan is a generator of named
statements, so the test runs each statement itself and changes the database between
two of them, exactly where a concurrent worker would.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from dbcheck import count_jobs, history
from support.claims import claim_params

from jobsd import Job, JobStatus, SyncClient, UnknownQueue
from jobsd.client import JobSpec
from jobsd.errors import DatabaseError, DuplicateJob
from jobsd.jsonsafe import ERROR_RECORDS_KEPT
from jobsd.store.enqueue import Statement, enqueue_plan
from jobsd.store.queries import run_named_sync


@pytest.fixture
def client(db_url: str) -> Iterator[SyncClient]:
    with SyncClient(db_url) as c:
        yield c


def _claim(conn: psycopg.Connection[Any], keep: list[str] | None = None) -> list[dict[str, Any]]:
    return run_named_sync(
        conn,
        "jobs_claim_batch",
        claim_params(10, "w1", keep_dedup_types=keep or []),
    )


def _drive(
    conn: psycopg.Connection[Any],
    spec: JobSpec,
    before: Callable[[int, Statement], None] = lambda i, s: None,
) -> tuple[Job, list[str]]:
    """Run the plan statement by statement, calling ``before`` ahead of each one."""
    plan = enqueue_plan(spec)
    names: list[str] = []
    statement = next(plan)
    while True:
        before(len(names), statement)
        names.append(statement.name)
        rows = run_named_sync(conn, statement.name, statement.params)
        try:
            statement = plan.send(rows)
        except StopIteration as done:
            return done.value, names


def test_second_enqueue_with_the_same_key_returns_the_existing_job(
    client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    first = client.enqueue("import_csv", {"v": 1}, org_id="acme", dedup_key="file-1")
    second = client.enqueue("import_csv", {"v": 2}, org_id="acme", dedup_key="file-1")

    assert second.id == first.id
    assert second.payload == {"v": 1}
    assert count_jobs(conn) == 1
    assert len(history(conn, first.id)) == 1


def test_the_same_key_in_another_org_is_a_separate_job(
    client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    a = client.enqueue("t", {}, org_id="acme", dedup_key="k")
    b = client.enqueue("t", {}, org_id="globex", dedup_key="k")

    assert a.id != b.id
    assert (a.org_id, b.org_id) == ("acme", "globex")
    assert count_jobs(conn, "dedup_key = 'k'") == 2


def test_the_same_client_job_id_twice_gives_one_job(
    client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    job_id = uuid.uuid4()
    first = client.enqueue("t", {"n": 1}, org_id="acme", job_id=job_id)
    again = client.enqueue("t", {"n": 1}, org_id="acme", job_id=job_id)

    assert first.id == again.id == job_id
    assert again == first
    assert count_jobs(conn) == 1


def test_a_job_id_of_another_org_is_a_duplicate(
    client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    job_id = uuid.uuid4()
    client.enqueue("t", {}, org_id="acme", job_id=job_id)

    with pytest.raises(DuplicateJob, match=str(job_id)):
        client.enqueue("t", {}, org_id="globex", job_id=job_id)

    assert conn.execute("SELECT org_id FROM jobsd.jobs").fetchall() == [("acme",)]


def test_holder_released_between_conflict_and_reread_then_reinsert_succeeds(
    conn: psycopg.Connection[Any],
) -> None:
    holder = _drive(conn, JobSpec.build("t", {"who": "holder"}, org_id="o", dedup_key="k"))[0]
    spec = JobSpec.build("t", {"who": "late"}, org_id="o", dedup_key="k")

    def release(i: int, statement: Statement) -> None:
        if statement.name == "jobs_get_by_dedup_key":
            # the holder starts running (scope 'queue'): its key is released
            assert [r["id"] for r in _claim(conn)] == [holder.id]

    job, names = _drive(conn, spec, before=release)

    assert names == ["jobs_insert", "jobs_get_by_dedup_key", "queues_exists", "jobs_insert"]
    assert job.id == spec.id != holder.id
    assert (job.status, job.dedup_key, job.payload) == (JobStatus.QUEUED, "k", {"who": "late"})
    rows = conn.execute("SELECT id, status, dedup_key FROM jobsd.jobs ORDER BY id").fetchall()
    assert rows == [(holder.id, "running", None), (spec.id, "queued", "k")]


def test_holder_finished_between_conflict_and_reread(conn: psycopg.Connection[Any]) -> None:
    # scope 'active': the key is held while running and released when the job ends
    holder = _drive(conn, JobSpec.build("t", {}, org_id="o", dedup_key="k"))[0]
    lease = _claim(conn, keep=["t"])[0]["lease_id"]
    spec = JobSpec.build("t", {}, org_id="o", dedup_key="k")

    def finish(i: int, statement: Statement) -> None:
        if statement.name == "jobs_get_by_dedup_key":
            done = run_named_sync(
                conn,
                "jobs_finish_batch",
                {
                    "results": json.dumps(
                        [{"id": str(holder.id), "lease_id": str(lease), "status": "succeeded"}]
                    ),
                    "confirm": False,
                    "errors_kept": ERROR_RECORDS_KEPT,
                },
            )
            assert [r["dedup_key"] for r in done] == [None]

    job, names = _drive(conn, spec, before=finish)

    assert names[-1] == "jobs_insert" and names.count("jobs_insert") == 2
    assert job.id == spec.id
    assert count_jobs(conn, "dedup_key = 'k'") == 1
    assert count_jobs(conn, "status = 'succeeded'") == 1


def test_key_changing_hands_every_time_gives_up_after_three_inserts(
    conn: psycopg.Connection[Any],
) -> None:
    holders: list[uuid.UUID] = []

    def take_key() -> None:
        holders.append(_drive(conn, JobSpec.build("t", {}, org_id="o", dedup_key="k"))[0].id)

    take_key()
    spec = JobSpec.build("t", {}, org_id="o", dedup_key="k")

    def hand_over(i: int, statement: Statement) -> None:
        if statement.name == "jobs_get_by_dedup_key":
            _claim(conn)  # the holder lets go ...
        if statement.name == "queues_exists":
            take_key()  # ... and someone else takes the key before our re-insert

    with pytest.raises(DatabaseError, match="gave up"):
        _drive(conn, spec, before=hand_over)

    assert len(holders) == 4
    assert count_jobs(conn, "id = %s", spec.id) == 0
    assert count_jobs(conn) == 4


def test_unknown_queue_in_the_plan(conn: psycopg.Connection[Any]) -> None:
    spec = JobSpec.build("t", {}, org_id="o", queue="nope", dedup_key="k")
    with pytest.raises(UnknownQueue, match="nope"):
        _drive(conn, spec)
    assert count_jobs(conn) == 0


def test_id_and_key_both_taken_returns_the_id_holder(
    client: SyncClient, conn: psycopg.Connection[Any]
) -> None:
    job_id = uuid.uuid4()
    mine = client.enqueue("t", {}, org_id="o", job_id=job_id, dedup_key="a")
    other = client.enqueue("t", {}, org_id="o", dedup_key="b")

    # a retried submission with the same id returns the job it created
    assert client.enqueue("t", {}, org_id="o", job_id=job_id, dedup_key="b").id == mine.id
    # a new id whose key is taken returns the key holder
    assert client.enqueue("t", {}, org_id="o", job_id=uuid.uuid4(), dedup_key="b").id == other.id
    assert count_jobs(conn) == 2
