"""Apply the numbered migrations of ``sql/migrations`` under an advisory lock.

Each migration runs in its own transaction together with the row that records it, so
a failure leaves the schema at the previous version. A second concurrent run waits for
the lock, then finds nothing to do. The checksum of every applied file is kept: an
edited shipped migration is an error, not a silent drift. ``apply_pending`` does the
same on a connection the caller holds, inside its transaction if one is open (each
migration then a savepoint).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from jobsd.errors import MigrationError
from jobsd.store.connect import connect
from jobsd.store.db import db_errors
from jobsd.store.sqlfiles import Migration, load_migrations

__all__ = ["MigrationStatus", "apply_pending", "migrate_sync", "migration_status_sync"]

log = logging.getLogger(__name__)

# pg_advisory_lock key: the bytes "jobsdmig" as a bigint
_LOCK_KEY = int.from_bytes(b"jobsdmig", "big") & 0x7FFF_FFFF_FFFF_FFFF

_BOOKKEEPING = """
CREATE SCHEMA IF NOT EXISTS jobsd;
CREATE TABLE IF NOT EXISTS jobsd.schema_migrations (
  version     integer PRIMARY KEY,
  name        text NOT NULL,
  checksum    text NOT NULL,
  applied_at  timestamptz NOT NULL DEFAULT now()
);
"""


@dataclass(frozen=True, slots=True)
class MigrationStatus:
    """One shipped migration and whether it is applied."""

    version: int
    name: str
    applied: bool


def _checksum(migration: Migration) -> str:
    return hashlib.sha256(migration.sql.encode("utf-8")).hexdigest()


def migrate_sync(database_url: str, *, up_to: int | None = None) -> list[str]:
    """Apply pending migrations (those up to version ``up_to`` only, when given: an older
    schema, for upgrade tests); return the names applied (empty when up to date)."""
    with connect(database_url, application_name="jobsd-migrate", operation="migrate") as conn:
        return apply_pending(conn, up_to=up_to)


def apply_pending(conn: psycopg.Connection[Any], *, up_to: int | None = None) -> list[str]:
    """Apply pending migrations on the caller's connection (up to version ``up_to`` only,
    when given); return the names applied (empty when up to date).

    On an autocommit connection outside a transaction, as ``migrate_sync`` runs it, the
    advisory lock is the session's and is released before returning, and each migration
    commits on its own with its row. Inside a transaction (the caller's open one, or the
    one a non-autocommit connection opens at the first statement) the lock is the
    transaction's, each migration is a savepoint, and nothing is committed here: the
    caller's commit keeps them all, its rollback none. Rows are read by position, so
    any row factory will do.
    """
    migrations = [m for m in load_migrations() if up_to is None or m.version <= up_to]
    own_transactions = (
        conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    )
    with db_errors("migrate"):
        if not own_transactions:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            return _apply(conn, migrations)
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            return _apply(conn, migrations)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))


def _apply(conn: psycopg.Connection[Any], migrations: list[Migration]) -> list[str]:
    """Create the bookkeeping table, check the applied checksums, apply the rest; the
    caller holds the lock."""
    applied_now: list[str] = []
    conn.execute(_BOOKKEEPING)
    done = _applied(conn)
    for migration in migrations:
        known = done.get(migration.version)
        if known is not None:
            if known != _checksum(migration):
                raise MigrationError(
                    f"migration {migration.name} was changed after it was applied; "
                    "shipped migrations must never be edited"
                )
            continue
        try:
            with conn.transaction():
                conn.execute(migration.sql.encode("utf-8"))
                conn.execute(
                    "INSERT INTO jobsd.schema_migrations (version, name, checksum) "
                    "VALUES (%s, %s, %s)",
                    (migration.version, migration.name, _checksum(migration)),
                )
        except psycopg.OperationalError:
            raise  # the connection went away: BackendUnavailable
        except psycopg.Error as exc:
            raise MigrationError(
                f"migration {migration.name} failed and was rolled back: {exc}"
            ) from exc
        log.info("migration.applied", extra={"migration": migration.name})
        applied_now.append(migration.name)
    return applied_now


def migration_status_sync(database_url: str) -> list[MigrationStatus]:
    """List the shipped migrations and which are applied."""
    operation = "migration status"
    with (
        connect(database_url, application_name="jobsd-migrate", operation=operation) as conn,
        db_errors(operation),
    ):
        exists = conn.execute(
            "SELECT to_regclass('jobsd.schema_migrations') IS NOT NULL AS exists"
        ).fetchone()
        done = _applied(conn) if exists and exists["exists"] else {}
    return [MigrationStatus(m.version, m.name, m.version in done) for m in load_migrations()]


def _applied(conn: psycopg.Connection[Any]) -> dict[int, str]:
    with conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute("SELECT version, checksum FROM jobsd.schema_migrations").fetchall()
    return {version: checksum for version, checksum in rows}
