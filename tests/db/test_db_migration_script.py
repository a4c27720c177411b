"""The migrations handed to another tool: ``migration_script`` and ``apply_pending``.

The script, run in one transaction, must leave the schema and the bookkeeping rows
exactly as ``migrate_sync`` does, so that ``migrate_sync`` then has nothing to do;
``apply_pending`` in the caller's transaction must follow that transaction's fate.
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from jobsd.errors import MigrationError
from jobsd.store.migrate import apply_pending, migrate_sync, migration_script
from jobsd.store.sqlfiles import load_migrations

LOCK_KEY = int.from_bytes(b"jobsdmig", "big") & 0x7FFF_FFFF_FFFF_FFFF

# everything of schema jobsd a migration makes, by definition, one query per kind
_CATALOG = {
    "relations": """
        SELECT c.relname, c.relkind::text, coalesce(c.relacl::text, ''),
               c.relrowsecurity, coalesce(pg_get_expr(c.relpartbound, c.oid), '')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'jobsd'""",
    "columns": """
        SELECT table_name, column_name, data_type, is_nullable,
               coalesce(column_default, '')
        FROM information_schema.columns WHERE table_schema = 'jobsd'""",
    "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'jobsd'",
    "constraints": """
        SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)
        FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
        WHERE n.nspname = 'jobsd'""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid),
               pg_get_functiondef(p.oid), coalesce(p.proacl::text, '')
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'jobsd' AND p.prokind IN ('f', 'p')""",
    "triggers": """
        SELECT t.tgrelid::regclass::text, t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'jobsd' AND NOT t.tgisinternal""",
    "policies": """
        SELECT tablename, policyname, permissive, roles::text, cmd,
               coalesce(qual, ''), coalesce(with_check, '')
        FROM pg_policies WHERE schemaname = 'jobsd'""",
    "queues": "SELECT name FROM jobsd.queues",
    "migrations": "SELECT version, name, checksum FROM jobsd.schema_migrations",
}


def _schema(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url, autocommit=True) as c:
        return {kind: sorted(c.execute(query).fetchall()) for kind, query in _CATALOG.items()}


def _expected_rows(up_to: int | None = None) -> list[tuple[int, str, str]]:
    return [
        (m.version, m.name, hashlib.sha256(m.sql.encode("utf-8")).hexdigest())
        for m in load_migrations()
        if up_to is None or m.version <= up_to
    ]


def _run_script(url: str, script: str) -> None:
    """Run ``script`` in one transaction, as ``psql --single-transaction`` does."""
    with psycopg.connect(url) as c:
        c.execute(script.encode("utf-8"))


def _has_jobsd_schema(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute("SELECT to_regnamespace('jobsd') IS NOT NULL").fetchone()
    return row == (True,)


def test_the_script_on_an_empty_database_gives_the_schema_of_migrate(
    empty_db_url: str, db_url: str
) -> None:
    _run_script(empty_db_url, migration_script())

    # db_url was migrated by migrate_sync: same objects, same definitions, same rows
    assert _schema(empty_db_url) == _schema(db_url)
    assert _schema(empty_db_url)["migrations"] == _expected_rows()
    assert migrate_sync(empty_db_url) == []


@pytest.mark.parametrize("after", [16, 26], ids=["after-a-gap", "after-the-last-but-one"])
def test_after_n_brings_a_database_migrated_up_to_n_to_current(
    empty_db_url: str, db_url: str, after: int
) -> None:
    migrate_sync(empty_db_url, up_to=after)
    assert _schema(empty_db_url)["migrations"] == _expected_rows(up_to=after)

    _run_script(empty_db_url, migration_script(after))

    assert _schema(empty_db_url) == _schema(db_url)
    assert migrate_sync(empty_db_url) == []


def test_the_script_stops_on_a_database_at_another_version(db_url: str, empty_db_url: str) -> None:
    before = _schema(db_url)
    # run twice: the second run finds every migration applied and changes nothing
    with pytest.raises(psycopg.errors.RaiseException, match="jobsd migrations applied"):
        _run_script(db_url, migration_script())
    assert _schema(db_url) == before

    # an upgrade script on a database that lacks what it starts from
    with pytest.raises(psycopg.errors.RaiseException, match="this script is for"):
        _run_script(empty_db_url, migration_script(after=26))
    assert not _has_jobsd_schema(empty_db_url)


def test_after_the_latest_version_applies_nothing(db_url: str) -> None:
    latest = load_migrations()[-1].version
    script = migration_script(after=latest + 5)
    assert f"-- no migration after version {latest + 5}" in script
    assert "INSERT INTO jobsd.schema_migrations" not in script
    before = _schema(db_url)

    _run_script(db_url, script)

    assert _schema(db_url) == before


def test_the_script_runs_as_an_alembic_revision_runs_it(empty_db_url: str) -> None:
    """``op.execute(script)`` runs ``sqlalchemy.text(script)`` on the revision's
    connection: no ``:name`` of the script may be taken for a bind parameter, and the
    percent signs must reach the server unchanged."""
    script = migration_script()
    assert sa.text(script).compile().params == {}
    engine = sa.create_engine(
        "postgresql+psycopg://", creator=lambda: psycopg.connect(empty_db_url)
    )
    try:
        with engine.begin() as connection:
            connection.execute(sa.text(script))
    finally:
        engine.dispose()

    assert migrate_sync(empty_db_url) == []


def _lock_is_free(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as other:
        row = other.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()
    return row == (True,)  # a lock held by a connection ends with it


def test_apply_pending_in_a_transaction_rolled_back_leaves_no_schema(empty_db_url: str) -> None:
    names = [m.name for m in load_migrations()]
    with psycopg.connect(empty_db_url) as conn:  # tuple rows, not autocommit
        conn.execute("SELECT 1")  # the caller's transaction is open
        assert apply_pending(conn) == names
        # the lock is the transaction's: held until it ends
        assert not _lock_is_free(empty_db_url)
        conn.rollback()
        assert _lock_is_free(empty_db_url)

    assert not _has_jobsd_schema(empty_db_url)


def test_apply_pending_in_a_transaction_committed_is_complete(
    empty_db_url: str, db_url: str
) -> None:
    names = [m.name for m in load_migrations()]
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        with conn.transaction():
            assert apply_pending(conn) == names
        assert _schema(empty_db_url) == _schema(db_url)
        # outside a transaction now: the connection's lock, nothing to do, the lock released
        assert apply_pending(conn) == []
        assert _lock_is_free(empty_db_url)
    assert migrate_sync(empty_db_url) == []


def test_apply_pending_failing_keeps_the_callers_transaction_usable(empty_db_url: str) -> None:
    with psycopg.connect(empty_db_url) as conn:
        conn.execute("CREATE TABLE caller_work (id int)")
        conn.execute("CREATE SCHEMA jobsd; CREATE TABLE jobsd.jobs (squatter int)")

        with pytest.raises(MigrationError, match="migration 0001_jobs failed"):
            apply_pending(conn)

        # only the failed migration's savepoint was rolled back
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert conn.execute("SELECT to_regclass('caller_work') IS NOT NULL").fetchone() == (True,)
        assert conn.execute("SELECT count(*) FROM jobsd.schema_migrations").fetchone() == (0,)
        conn.rollback()
