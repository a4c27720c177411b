"""Typed tasks against the database and the daemon: a model goes in at enqueue and comes
out in the handler with its types; a payload that does not validate is refused at
enqueue, or, when it reached the database by name, fails its job at once, without a
retry; JOBSD_DEFAULT_ORG stands in for an org that is not given."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from support.history import assert_history_complete_async

import jobsd
from jobsd.errors import ConfigError, InvalidPayload, PayloadMismatch
from jobsd.settings import Settings

from .conftest import ADb, fetch_job, make_settings, running_daemon, wait_status
from .typed_handlers import RECEIVED, REGISTRY, ImportCsv, import_csv, import_csv_apart

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

DUE = dt.datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=dt.timezone(dt.timedelta(hours=2)))
REF = uuid.UUID("0190a5b4-0000-7000-8000-00000000abcd")
ORDER = ImportCsv(file="a.csv", due=DUE, ref=REF, amount=Decimal("12.50"))


async def count_jobs(db: ADb) -> int:
    cur = await db.execute("SELECT count(*) AS n FROM jobsd.jobs")
    row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


@pytest.fixture
def default_client_env(db_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point ``jobsd.enqueue``'s default client at the test's database."""
    monkeypatch.setenv("JOBSD_DATABASE_URL", db_url)
    monkeypatch.delenv("JOBSD_DEFAULT_ORG", raising=False)
    return db_url


async def test_a_typed_task_round_trips_its_model_through_the_daemon(
    db_url: str, db: ADb, client: jobsd.Client, default_client_env: str
) -> None:
    try:
        async with running_daemon(make_settings(db_url), REGISTRY):
            # the default client (jobsd.enqueue's), and an explicit one
            by_default = await import_csv.enqueue(ORDER, org_id="acme", priority=-1)
            as_dict = await import_csv.enqueue(
                {"file": "b.csv", "due": DUE, "ref": str(REF)}, org_id="acme", client=client
            )
            rows = [
                await wait_status(db, job.id, "succeeded", "failed")
                for job in (by_default, as_dict)
            ]
    finally:
        await jobsd.aclose()

    assert by_default.type == "import_csv" and by_default.priority == -1
    # stored as pydantic's JSON mode writes it
    assert by_default.payload == {
        "file": "a.csv",
        "due": "2030-01-02T03:04:05.678000+02:00",
        "ref": str(REF),
        "amount": "12.50",
    }
    assert [r["status"] for r in rows] == ["succeeded", "succeeded"]
    assert rows[0]["report"] == {"due": "datetime", "ref": "UUID"}
    received = dict(RECEIVED)
    assert received[by_default.id] == ORDER
    second = received[as_dict.id]
    assert isinstance(second, ImportCsv)
    assert (second.due, second.ref, second.amount) == (DUE, REF, Decimal("0"))
    assert second.due.utcoffset() == dt.timedelta(hours=2)
    await assert_history_complete_async(db)


@pytest.mark.slow  # starts a handler process
async def test_a_typed_handler_in_a_handler_process_gets_its_model(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    async with running_daemon(make_settings(db_url), REGISTRY):
        job = await import_csv_apart.enqueue(ORDER, org_id="acme", client=client)
        row = await wait_status(db, job.id, "succeeded", "failed", timeout_s=30)

    assert row["status"] == "succeeded", row["error"]
    report = row["report"]
    assert report["pid"] != os.getpid()
    assert report["types"] == ["datetime", "UUID", "Decimal"]
    assert (report["due"], report["ref"], report["amount"]) == (
        DUE.isoformat(),
        str(REF),
        "12.50",
    )


async def test_a_wrong_field_fails_at_enqueue_and_leaves_the_transaction_usable(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    bad = {"file": "a.csv", "due": [2030], "ref": str(REF)}
    with pytest.raises(InvalidPayload) as caught:
        await import_csv.enqueue(bad, org_id="acme", client=client)
    assert isinstance(caught.value, PayloadMismatch)
    assert str(caught.value) == (
        "invalid payload for import_csv: field 'due': Input should be a valid datetime"
    )
    async with await psycopg.AsyncConnection.connect(db_url) as caller, caller.transaction():
        with pytest.raises(PayloadMismatch, match="field 'ref': Input should be a valid UUID"):
            await import_csv.enqueue(
                {"file": "a", "due": DUE, "ref": "nope"}, org_id="acme", conn=caller, client=client
            )
        # refused before any SQL: the caller's transaction goes on
        await caller.execute("SELECT 1")
    assert await count_jobs(db) == 0


async def test_a_payload_that_does_not_validate_in_the_daemon_fails_at_once(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    # enqueued by name, as a web tier that does not import the handlers would
    async with running_daemon(make_settings(db_url), REGISTRY):
        jobs = [
            await client.enqueue(kind, {"file": "a", "due": "soon", "ref": str(REF)}, org_id="acme")
            for kind in ("import_csv", "import_csv_apart")
        ]
        rows = [await wait_status(db, job.id, "failed", "succeeded", timeout_s=30) for job in jobs]

    for row in rows:
        # the type retries every Exception three times: not this one
        assert (row["status"], row["attempts"], row["reason"]) == ("failed", 1, "handler error")
        assert row["error"].startswith(
            f"PayloadMismatch: invalid payload for {row['type']}: field 'due': "
            "Input should be a valid datetime"
        ), row["error"]
        assert row["report"]["error"]["type"] == "jobsd.errors.PayloadMismatch"
        assert "soon" not in row["error"]
    assert jobs[0].id not in dict(RECEIVED), "the handler never ran"
    await assert_history_complete_async(db)


async def test_a_typed_task_enqueues_in_the_callers_transaction(
    db_url: str, db: ADb, client: jobsd.Client
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url) as caller:
        async with caller.transaction(force_rollback=True):
            await import_csv.enqueue(ORDER, org_id="acme", conn=caller, client=client)
        assert await count_jobs(db) == 0, "rolled back with the caller's transaction"
        async with caller.transaction():
            job = await import_csv.enqueue(
                ORDER, org_id="acme", conn=caller, client=client, dedup_key="a.csv"
            )
    row = await fetch_job(db, job.id)
    assert (row["status"], row["dedup_key"], row["payload"]["ref"]) == ("queued", "a.csv", str(REF))


def test_enqueue_sync_takes_a_sync_client_or_the_default_one(
    db_url: str, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    with jobsd.SyncClient(db_url) as sync_client:
        job = import_csv.enqueue_sync(ORDER, org_id="acme", client=sync_client, queue="default")
    monkeypatch.setenv("JOBSD_DATABASE_URL", db_url)
    monkeypatch.setenv("JOBSD_DEFAULT_ORG", "beta")
    try:
        again = import_csv.enqueue_sync({"file": "b", "due": DUE, "ref": REF})
    finally:
        jobsd.close()
    rows = conn.execute(
        "SELECT id, org_id, payload->>'due' FROM jobsd.jobs ORDER BY created_at"
    ).fetchall()
    assert rows == [
        (job.id, "acme", "2030-01-02T03:04:05.678000+02:00"),
        (again.id, "beta", "2030-01-02T03:04:05.678000+02:00"),
    ]


async def test_the_default_org_stands_in_for_an_org_not_given(db_url: str, db: ADb) -> None:
    with_default = Settings(database_url=db_url, default_org="acme")
    async with jobsd.Client(db_url, settings=with_default) as client:
        defaulted = await client.enqueue("t", {"n": 1})
        explicit = await client.enqueue("t", {"n": 2}, org_id="beta")
        typed = await import_csv.enqueue(ORDER, client=client)
        with pytest.raises(ValueError, match="org_id must be a non-empty string"):
            await client.enqueue("t", {}, org_id="")  # an explicit org is never replaced
    assert (defaulted.org_id, explicit.org_id, typed.org_id) == ("acme", "beta", "acme")

    without = Settings(database_url=db_url, default_org=None)
    async with jobsd.Client(db_url, settings=without) as client:
        with pytest.raises(ConfigError, match="no org_id given and JOBSD_DEFAULT_ORG is not set"):
            await client.enqueue("t", {"n": 3})
        with pytest.raises(ConfigError, match="JOBSD_DEFAULT_ORG"):
            await import_csv.enqueue(ORDER, client=client)
    with (
        jobsd.SyncClient(db_url, settings=without) as sync_client,
        pytest.raises(ConfigError, match="JOBSD_DEFAULT_ORG"),
    ):
        sync_client.enqueue("t", {"n": 4})
    assert await count_jobs(db) == 3


async def test_a_model_is_a_payload_of_a_plain_enqueue(db_url: str, client: jobsd.Client) -> None:
    job = await client.enqueue("import_csv", ORDER, org_id="acme")
    assert job.payload["due"] == "2030-01-02T03:04:05.678000+02:00"
    plain = await client.enqueue(
        "t", {"at": DUE, "id": REF, "price": Decimal("1.10"), "day": DUE.date()}, org_id="acme"
    )
    assert plain.payload == {
        "at": "2030-01-02T03:04:05.678000+02:00",
        "id": str(REF),
        "price": "1.10",
        "day": "2030-01-02",
    }
