"""jobs.errors (migration 0028): the statement that writes an attempt's outcome adds its
error record, on the database's clock, most recent first, the last ten kept; a success
adds nothing; a rescue adds one; an archived job keeps them; the column's cap holds for
raw SQL too."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbcheck import claim_one, insert_job

from jobsd import SyncClient
from jobsd.jsonsafe import ERROR_RECORDS_KEPT, TRACEBACK_MAX_BYTES, error_record
from jobsd.models import Job
from jobsd.store import queries
from jobsd.store.queries import FinishRow
from jobsd.worker.decide import rescuer, rules_from
from jobsd.worker.outcome import error_record_of, failure

pytestmark = pytest.mark.anyio

AConn = psycopg.AsyncConnection[Any]
Conn = psycopg.Connection[Any]


def failed_row(run: Job, n: int, *, status: str = "scheduled") -> FinishRow:
    """The outcome of a handler error at attempt ``n``, as the daemon writes it."""
    out = failure(
        f"ValueError: boom {n}",
        reason="handler error",
        detail={"type": "builtins.ValueError", "traceback": f"Traceback\n  step {n}\nValueError\n"},
    )
    assert run.lease_id is not None
    return FinishRow(
        run.id,
        run.lease_id,
        status,
        out.report_json,
        out.error,
        "retry" if status == "scheduled" else "handler error",
        None,
        delay_s=0.0 if status == "scheduled" else None,
        error_record=error_record_of(out),
    )


async def stored_errors(aconn: AConn, job_id: uuid.UUID) -> Any:
    cur = await aconn.execute("SELECT errors FROM jobsd.all_jobs WHERE id = %s", (job_id,))
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def requeue(aconn: AConn, job_id: uuid.UUID) -> None:
    """Make a scheduled retry due and queued, as the promotion would."""
    await aconn.execute(
        "UPDATE jobsd.jobs SET status = 'queued', reason = 'due' WHERE id = %s", (job_id,)
    )


async def test_each_failed_attempt_adds_its_record_first_on_the_database_clock(
    aconn: AConn, db_url: str
) -> None:
    job_id = await insert_job(aconn)
    for n in (1, 2):
        run = await claim_one(aconn)
        before = datetime.now(UTC) - timedelta(seconds=5)
        written = await queries.finish_batch(aconn, [failed_row(run, n)])
        assert list(written) == [job_id]
        await requeue(aconn, job_id)
    run = await claim_one(aconn)
    await queries.finish_batch(aconn, [failed_row(run, 3, status="failed")])

    stored = await stored_errors(aconn, job_id)
    assert [r["attempt"] for r in stored] == [3, 2, 1]
    assert stored[0] == {
        "attempt": 3,
        "at": stored[0]["at"],
        "type": "builtins.ValueError",
        "message": "ValueError: boom 3",
        "traceback": "Traceback\n  step 3\nValueError\n",
        "cause": "handler error",
    }
    assert datetime.fromisoformat(stored[0]["at"]) >= before
    ats = [datetime.fromisoformat(r["at"]) for r in stored]
    assert ats == sorted(ats, reverse=True)
    with SyncClient(db_url) as client:
        job = client.get(job_id)
    assert [(e.attempt, e.message) for e in job.errors] == [
        (3, "ValueError: boom 3"),
        (2, "ValueError: boom 2"),
        (1, "ValueError: boom 1"),
    ]
    # the last attempt's error, reason and report are as they always were
    assert (job.error, job.reason) == ("ValueError: boom 3", "handler error")
    assert job.report is not None and job.report["error"]["type"] == "builtins.ValueError"


async def test_a_success_writes_nothing_and_a_repeated_write_adds_no_second_record(
    aconn: AConn, db_url: str
) -> None:
    ok_id, bad_id = await insert_job(aconn), await insert_job(aconn)
    runs = [await claim_one(aconn), await claim_one(aconn)]
    ok = next(r for r in runs if r.id == ok_id)
    bad = next(r for r in runs if r.id == bad_id)
    assert ok.lease_id is not None
    rows = [FinishRow(ok.id, ok.lease_id, "succeeded", None, None, None, None),
            failed_row(bad, 1, status="failed")]  # fmt: skip
    assert set(await queries.finish_batch(aconn, rows)) == {ok_id, bad_id}
    # the same batch again (its first answer lost): confirmed, nothing added twice
    assert set(await queries.finish_batch(aconn, rows, confirm=True)) == {ok_id, bad_id}
    assert await stored_errors(aconn, ok_id) is None
    assert [r["attempt"] for r in await stored_errors(aconn, bad_id)] == [1]
    with SyncClient(db_url) as client:
        assert client.get(ok_id).errors == []


async def test_twelve_failed_attempts_keep_the_last_ten(aconn: AConn) -> None:
    job_id = await insert_job(aconn)
    for n in range(1, 13):
        run = await claim_one(aconn)
        await queries.finish_batch(aconn, [failed_row(run, n, status="scheduled")])
        await requeue(aconn, job_id)
    stored = await stored_errors(aconn, job_id)
    assert len(stored) == ERROR_RECORDS_KEPT == 10
    assert [r["attempt"] for r in stored] == list(range(12, 2, -1))
    assert [r["message"] for r in stored][-1] == "ValueError: boom 3"


async def test_caps_hold_through_the_write(aconn: AConn) -> None:
    job_id = await insert_job(aconn)
    run = await claim_one(aconn)
    assert run.lease_id is not None
    traceback = "".join(f"  frame {i:06d}\n" for i in range(7000)) + "KeyError: 'end'\n"
    assert len(traceback.encode()) > 100_000
    out = failure(
        "K" * 10_240, reason="handler error", detail={"type": "builtins.KeyError",
                                                       "traceback": traceback}
    )  # fmt: skip
    row = FinishRow(run.id, run.lease_id, "failed", out.report_json, out.error,
                    "handler error", None, error_record=error_record_of(out))  # fmt: skip
    await queries.finish_batch(aconn, [row])
    (record,) = await stored_errors(aconn, job_id)
    assert len(record["message"].encode()) == 2048
    assert record["message"].endswith(" [truncated]")
    assert len(record["traceback"].encode()) <= TRACEBACK_MAX_BYTES
    first, rest = record["traceback"].split("\n", 1)
    cut = len(traceback.encode()) - len(rest.encode())
    assert first == f"[traceback cut: its first {cut} bytes are not kept]"
    assert traceback.endswith(rest) and rest.endswith("KeyError: 'end'\n")
    # the report keeps the whole traceback, as before
    cur = await aconn.execute("SELECT report FROM jobsd.jobs WHERE id = %s", (job_id,))
    assert (await cur.fetchone())[0]["error"]["traceback"] == traceback  # type: ignore[index]


async def test_a_rescue_records_the_lost_attempt(aconn: AConn, db_url: str) -> None:
    requeued, exhausted = await insert_job(aconn), await insert_job(aconn)
    await claim_one(aconn, "dead-1")
    await claim_one(aconn, "dead-1")
    await aconn.execute(
        "UPDATE jobsd.jobs SET attempts = 3 WHERE id = %s", (exhausted,)
    )  # its last attempt allowed
    rescued = await queries.sweep_stale(
        aconn,
        worker_id="sweeper",
        stale_after_s=60.0,
        decide=rescuer(rules_from(max_attempts={"t": 3})),
        now=datetime.now(UTC) + timedelta(seconds=300),
    )
    assert {j.id: str(j.status) for j in rescued} == {requeued: "queued", exhausted: "failed"}
    (again,) = await stored_errors(aconn, requeued)
    assert (again["attempt"], again["cause"], again["type"], again["traceback"]) == (
        1,
        "worker lost",
        None,
        None,
    )
    assert again["message"] == "worker lost: owner unresponsive at attempt 1"
    (final,) = await stored_errors(aconn, exhausted)
    assert final["attempt"] == 3 and final["cause"] == "worker lost"
    assert final["message"] == "max attempts exceeded: owner unresponsive at attempt 3 of 3"
    with SyncClient(db_url) as client:
        assert [e.cause for e in client.get(requeued).errors] == ["worker lost"]


async def test_an_archived_job_keeps_its_records(aconn: AConn, conn: Conn, db_url: str) -> None:
    job_id = await insert_job(aconn)
    run = await claim_one(aconn)
    await queries.finish_batch(aconn, [failed_row(run, 1, status="failed")])
    before = await stored_errors(aconn, job_id)
    assert conn.execute("SELECT jobsd.archive_move(100, 0)").fetchone() == (1,)
    assert conn.execute("SELECT count(*) FROM jobsd.jobs WHERE id = %s", (job_id,)).fetchone() == (
        0,
    )
    archived = conn.execute(
        "SELECT errors FROM jobsd.jobs_archive WHERE id = %s", (job_id,)
    ).fetchone()
    assert archived == (before,)
    with SyncClient(db_url) as client:
        job = client.get(job_id)
    assert [(e.attempt, e.cause) for e in job.errors] == [(1, "handler error")]


def test_the_column_is_last_in_both_tables_and_in_the_view(conn: Conn) -> None:
    def columns(table: str) -> list[str]:
        rows = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            (table,),
        ).fetchall()
        return [r[0] for r in rows]

    hot = columns("jobsd.jobs")
    # the history's ids (migration 0032) came after it
    assert hot[-4:] == ["errors", "created_event_id", "start_event_id", "end_event_id"]
    assert columns("jobsd.jobs_archive") == hot
    assert columns("jobsd.all_jobs") == hot
    options = conn.execute(
        "SELECT reloptions FROM pg_class WHERE oid = 'jobsd.all_jobs'::regclass"
    ).fetchone()
    assert options == (["security_invoker=true"],), "the view still reads as its caller"


def test_raw_sql_cannot_store_what_is_no_list_of_records_or_too_large(conn: Conn) -> None:
    with SyncClient(conn.info.dsn) as client:
        job = client.enqueue("t", {}, org_id="acme")
    for value in ('{"attempt": 1}', json.dumps(["x" * 2_100_000])):
        with pytest.raises(psycopg.errors.CheckViolation, match="jobs_errors_size"):
            conn.execute("UPDATE jobsd.jobs SET errors = %s::jsonb WHERE id = %s", (value, job.id))
    # the most the daemon writes fits well under the cap
    worst = [
        error_record("\x01" * 4000, cause="c" * 600, type="t" * 600, traceback="\x01" * 40_000)
        | {"attempt": n, "at": "2030-01-01T00:00:00+00:00"}
        for n in range(ERROR_RECORDS_KEPT)
    ]
    conn.execute(
        "UPDATE jobsd.jobs SET errors = %s::jsonb WHERE id = %s", (json.dumps(worst), job.id)
    )


def test_error_records_push_keeps_the_newest(conn: Conn) -> None:
    def push(errors: Any, keep: int) -> Any:
        return conn.execute(
            "SELECT jobsd.error_records_push(%s::jsonb, '{\"n\": 0}', %s)",
            (json.dumps(errors) if errors is not None else None, keep),
        ).fetchone()[0]

    assert push(None, 10) == [{"n": 0}]
    assert push([{"n": 1}, {"n": 2}], 10) == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert push([{"n": i} for i in range(1, 11)], 10) == [{"n": i} for i in range(10)]
    assert push({"not": "a list"}, 10) == [{"n": 0}]
