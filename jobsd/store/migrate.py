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
from importlib import metadata
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from jobsd.errors import MigrationError
from jobsd.store.connect import connect
from jobsd.store.db import db_errors
from jobsd.store.sqlfiles import Migration, load_migrations

__all__ = [
    "MigrationStatus",
    "apply_pending",
    "migrate_sync",
    "migration_script",
    "migration_status_sync",
]

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
    advisory lock is the connection's (``pg_advisory_lock``), released before returning,
    and each migration commits on its own with its row. Inside a transaction (the
    caller's open one, or the one a non-autocommit connection opens at the first
    statement) the lock is the transaction's, each migration is a savepoint, and nothing
    is committed here: the caller's commit keeps them all, its rollback none. Rows are
    read by position, so any row factory will do.
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


def migration_script(after: int | None = None) -> str:
    """Return the migrations after version ``after`` (all when None) as one SQL script
    that does what ``migrate_sync`` does on a database with exactly the migrations up to
    ``after`` applied (none when None), bookkeeping rows and checksums included.

    Nothing is read from a database. The script opens no transaction: its runner runs it
    in one (``psql --single-transaction``, an Alembic revision), which holds the advisory
    lock to its end. On a database at another version the script fails at its first
    statements and changes nothing: it never applies a migration twice.
    """
    if after is not None and after < 0:
        raise ValueError(f"after must be a version (0 or more), not {after}")
    shipped = load_migrations()
    base = [m.version for m in shipped if after is not None and m.version <= after]
    todo = [m for m in shipped if after is None or m.version > after]
    parts = [
        _header(after, has_base=bool(base)),
        f"SELECT pg_advisory_xact_lock({_LOCK_KEY});\n",
        _BOOKKEEPING.strip() + "\n",
        _guard(base),
    ]
    if not todo:
        latest = shipped[-1].name if shipped else "none"
        parts.append(f"-- no migration after version {after}: the latest is {latest}\n")
    for migration in todo:
        parts.append(
            f"-- migration {migration.name}\n"
            + migration.sql.rstrip()
            + "\n\nINSERT INTO jobsd.schema_migrations (version, name, checksum) VALUES ("
            f"{migration.version}, {_literal(migration.name)}, {_literal(_checksum(migration))});\n"
        )
    return "\n".join(parts)


def _header(after: int | None, *, has_base: bool) -> str:
    """Return the script's opening comment: what it is, for which database, how to run it."""
    command = "jobsd migrate --sql" + ("" if after is None else f" --after {after}")
    start = f"the migrations up to version {after}" if has_base else "no jobsd migration"
    return (
        f"-- jobsd {_jobsd_version()} schema migrations, as one SQL script ({command})\n"
        "--\n"
        "-- It does what `jobsd migrate` does, and records each migration in\n"
        "-- jobsd.schema_migrations with the same checksum: `jobsd migrate` and the daemon\n"
        "-- then find the schema up to date. It is for a database with\n"
        f"-- {start} applied; on any other it stops at the check below.\n"
        "-- It opens no transaction: run it in one, e.g.\n"
        "--   psql --single-transaction -v ON_ERROR_STOP=1 -f jobsd.sql\n"
    )


def _guard(base: list[int]) -> str:
    """Return a statement that fails unless exactly the versions ``base`` are applied."""
    expected = _literal("{" + ",".join(map(str, base)) + "}") + "::integer[]"
    return (
        "-- the database must have exactly the migrations this script starts from\n"
        "DO $guard$\n"
        "DECLARE\n"
        "  found integer[] := ARRAY(SELECT version FROM jobsd.schema_migrations ORDER BY 1);\n"
        "BEGIN\n"
        f"  IF found IS DISTINCT FROM {expected} THEN\n"
        "    RAISE EXCEPTION 'jobsd migrations applied: %, this script is for %', found, "
        f"{expected}\n"
        "      USING HINT = 'run jobsd migrate, or apply the script of "
        "jobsd migrate --sql --after <the last version applied>';\n"
        "  END IF;\n"
        "END\n"
        "$guard$;\n"
    )


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _jobsd_version() -> str:
    try:
        return metadata.version("jobsd")
    except metadata.PackageNotFoundError:  # a checkout that was never installed
        return "0+unknown"


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
