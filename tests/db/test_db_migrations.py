"""Migrations: from empty, re-run, concurrent runs, and a tampered checksum."""

from __future__ import annotations

import hashlib
import threading

import psycopg
import pytest

from jobsd.errors import MigrationError
from jobsd.store.migrate import migrate_sync, migration_status_sync
from jobsd.store.sqlfiles import load_migrations


def _migration_rows(url: str) -> list[tuple[int, str, str]]:
    with psycopg.connect(url, autocommit=True) as c:
        return c.execute(
            "SELECT version, name, checksum FROM jobsd.schema_migrations ORDER BY version"
        ).fetchall()


def _expected_rows() -> list[tuple[int, str, str]]:
    return [
        (m.version, m.name, hashlib.sha256(m.sql.encode("utf-8")).hexdigest())
        for m in load_migrations()
    ]


def test_from_empty_applies_every_migration_and_records_it(empty_db_url: str) -> None:
    assert [s.applied for s in migration_status_sync(empty_db_url)] == [False] * len(
        load_migrations()
    )

    applied = migrate_sync(empty_db_url)

    assert applied[0] == "0001_jobs"
    assert applied == [m.name for m in load_migrations()]
    assert _migration_rows(empty_db_url) == _expected_rows()
    assert all(s.applied for s in migration_status_sync(empty_db_url))
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        tables = {
            r[0]
            for r in c.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'jobsd'"
            )
        }
        assert {"jobs", "job_events", "queues", "schema_migrations"} <= tables
        assert c.execute("SELECT name FROM jobsd.queues").fetchall() == [("default",)]


def test_rerun_is_a_noop(empty_db_url: str) -> None:
    migrate_sync(empty_db_url)
    before = _migration_rows(empty_db_url)
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        c.execute("INSERT INTO jobsd.queues (name) VALUES ('kept')")

    assert migrate_sync(empty_db_url) == []

    assert _migration_rows(empty_db_url) == before
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        # nothing was re-created: the queue added in between is still there
        assert c.execute("SELECT name FROM jobsd.queues ORDER BY name").fetchall() == [
            ("default",),
            ("kept",),
        ]


def test_concurrent_runs_both_succeed_and_apply_once(empty_db_url: str) -> None:
    results: dict[int, list[str]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def run(i: int) -> None:
        try:
            start.wait(timeout=10)
            results[i] = migrate_sync(empty_db_url)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert errors == []
    names = [m.name for m in load_migrations()]
    # exactly one run applied everything, the other found nothing to do
    assert sorted(results.values(), key=len) == [[], names]
    assert _migration_rows(empty_db_url) == _expected_rows()


def test_an_applied_migration_that_changed_is_an_error(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("UPDATE jobsd.schema_migrations SET checksum = 'tampered' WHERE version = 1")

    with pytest.raises(MigrationError, match="0001_jobs"):
        migrate_sync(db_url)

    # the advisory lock was released: another session can take it at once
    with psycopg.connect(db_url, autocommit=True) as c:
        row = c.execute(
            "SELECT pg_try_advisory_lock(%s)",
            (int.from_bytes(b"jobsdmig", "big") & 0x7FFF_FFFF_FFFF_FFFF,),
        ).fetchone()
        assert row == (True,)


def test_a_failing_migration_is_rolled_back_and_named(empty_db_url: str) -> None:
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        c.execute("CREATE SCHEMA jobsd; CREATE TABLE jobsd.jobs (squatter int)")

    with pytest.raises(MigrationError, match="migration 0001_jobs failed") as info:
        migrate_sync(empty_db_url)

    assert isinstance(info.value.__cause__, psycopg.errors.DuplicateTable)
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        # nothing of 0001 is left behind and it is not recorded
        assert c.execute("SELECT to_regclass('jobsd.queues')").fetchone() == (None,)
        assert c.execute("SELECT count(*) FROM jobsd.schema_migrations").fetchone() == (0,)
        c.execute("DROP TABLE jobsd.jobs")
    assert migrate_sync(empty_db_url)[0] == "0001_jobs"
