"""Hostile input at the database (issue 12): caps every path obeys, limits in bigint,
and errors classified by SQLSTATE (only an unreachable database is retried)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from jobsd import SyncClient
from jobsd.errors import BackendUnavailable, DatabaseError, PayloadTooLarge
from jobsd.settings import Settings
from jobsd.store.db import db_errors, is_unavailable

BIG = 1_048_576


def _insert(conn: psycopg.Connection[Any], **cols: Any) -> None:
    row = {"org_id": "acme", "type": "t", **cols}
    names = ", ".join(row)
    marks = ", ".join(["%s"] * len(row))
    conn.execute(f"INSERT INTO jobsd.jobs ({names}) VALUES ({marks})", list(row.values()))


def _count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM jobsd.jobs").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(
    ("column", "value", "constraint"),
    [
        ("payload", psycopg.types.json.Jsonb({"x": "y" * BIG}), "jobs_payload_size"),
        ("report", psycopg.types.json.Jsonb({"x": "y" * BIG}), "jobs_report_size"),
        ("progress", psycopg.types.json.Jsonb({"x": "y" * BIG}), "jobs_progress_size"),
        ("type", "t" * 201, "jobs_type_size"),
        ("dedup_key", "k" * 513, "jobs_dedup_key_size"),
        ("org_id", "é" * 128, "jobs_org_id_size"),  # 256 bytes
    ],
)
def test_raw_sql_cannot_insert_an_oversized_value(
    conn: psycopg.Connection[Any], column: str, value: Any, constraint: str
) -> None:
    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        _insert(conn, **{column: value})
    assert caught.value.diag.constraint_name == constraint
    assert _count(conn) == 0


def test_values_at_the_limits_are_stored(conn: psycopg.Connection[Any]) -> None:
    # jsonb text of {"x": "..."} is 9 bytes more than the string
    _insert(
        conn,
        payload=psycopg.types.json.Jsonb({"x": "y" * (BIG - 9)}),
        type="t" * 200,
        dedup_key="ü" * 512,  # 1024 bytes: still fits the unique index with the org
        org_id="o" * 255,
    )
    assert _count(conn) == 1


def test_an_oversized_row_from_the_client_is_a_clear_error_and_nothing_is_stored(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    # under the client's own cap (set high here) but over the database's
    settings = Settings(max_payload_bytes=4 * BIG)
    with (
        SyncClient(db_url, settings=settings) as client,
        pytest.raises(PayloadTooLarge, match="database's limit"),
    ):
        client.enqueue("t", {"x": "y" * (BIG + 10)}, org_id="acme")
    assert _count(conn) == 0


def test_the_largest_capacity_admits_jobs(db_url: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("INSERT INTO jobsd.queues (name, capacity) VALUES ('wide', 2147483647)")
    with SyncClient(db_url) as client:
        job = client.enqueue("t", {}, org_id="acme", queue="wide")
    assert job.queue == "wide"
    assert _count(conn) == 1


@pytest.mark.parametrize(
    ("statement", "sqlstate"),
    [
        ("SELECT array_fill(1, ARRAY[1000000000])", "54000"),  # program_limit_exceeded
        ("SELECT 1 / 0", "22012"),  # a data error
    ],
)
def test_limits_and_data_errors_are_poison_not_an_outage(
    conn: psycopg.Connection[Any], statement: str, sqlstate: str
) -> None:
    with pytest.raises(DatabaseError) as caught, db_errors("probe"), conn.transaction():
        for part in statement.split(";"):
            conn.execute(part)
    assert not isinstance(caught.value, BackendUnavailable)
    cause = caught.value.__cause__
    assert isinstance(cause, psycopg.Error) and cause.sqlstate == sqlstate
    assert not is_unavailable(cause)


def test_a_full_disk_is_an_outage_not_poison(conn: psycopg.Connection[Any]) -> None:
    # Postgres raises disk_full (53100) for every write while pg_wal or the data
    # directory has no room: the outcome is not at fault, and once space is freed
    # the same statement succeeds. Treating it as poison failed succeeded jobs
    # "result rejected" (fault scenario T10).
    with pytest.raises(BackendUnavailable), db_errors("probe"):
        conn.execute("DO $$ BEGIN RAISE EXCEPTION 'no space' USING ERRCODE = 'disk_full'; END $$")


def test_a_terminated_connection_is_an_outage(
    admin_url: str, conn: psycopg.Connection[Any]
) -> None:
    pid = conn.info.backend_pid
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(BackendUnavailable), db_errors("probe"):
        conn.execute("SELECT 1")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"type": "t" * 201}, "job type"),
        ({"org_id": "o" * 256}, "org_id"),
        ({"dedup_key": "k" * 513}, "dedup_key"),
        ({}, "nested"),
    ],
)
def test_the_client_refuses_what_the_database_would_before_any_sql(
    db_url: str, conn: psycopg.Connection[Any], args: dict[str, Any], message: str
) -> None:
    deep: Any = []
    for _ in range(100):
        deep = [deep]
    call: dict[str, Any] = {"type": "t", "payload": {}, "org_id": "acme", **args}
    if message == "nested":
        call["payload"] = {"a": deep}
    with SyncClient(db_url) as client, pytest.raises(ValueError, match=message):
        client.enqueue(call.pop("type"), call.pop("payload"), **call)
    assert _count(conn) == 0
