"""The statements of ``jobsd.testing`` (``sql/testing/testing.sql``): a test session's
database, and its return to the just-migrated state before each test.

A reset is one transaction on a connection the session keeps: every table of schema
jobsd emptied (in replica mode: no trigger fires, no foreign key is checked, so the
order does not matter and nothing is written to the history), the rows the migrations
left put back (the ``default`` queue, the key of the done notifications), the
sequences set back and any trigger turned off since turned on again: about a
millisecond, where a copy of a template database per test took a third of a second
(docs/testing.md, "Isolation").
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import LiteralString, TypeVar
from urllib.parse import quote, urlsplit

from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobsd.errors import BackendUnavailable
from jobsd.models import Job
from jobsd.store.connect import connect
from jobsd.store.db import AsyncConn, SyncConn, db_errors
from jobsd.store.sqlfiles import load_named

__all__ = [
    "SessionDatabase",
    "create_database",
    "database_url",
    "drop_database",
    "jobs_by_id",
]

_APP = "jobsd-testing"

T = TypeVar("T")


def _text(name: str) -> LiteralString:
    # The text comes from our own shipped files, never from input.
    return load_named("testing")[name]


def _statement(name: str, **names: sql.Composable) -> sql.Composed:
    return sql.SQL(_text(name)).format(**names)


def create_database(admin_url: str, name: str) -> None:
    """Create the empty database ``name`` on the server of ``admin_url`` (a superuser's)."""
    _on_server(admin_url, "testing_create_database", name, f"creation of test database {name!r}")


def drop_database(admin_url: str, name: str) -> None:
    """Drop the database ``name`` (if it exists), ending the sessions still on it."""
    _on_server(admin_url, "testing_drop_database", name, f"drop of test database {name!r}")


def _on_server(admin_url: str, statement: str, name: str, operation: str) -> None:
    with (
        connect(admin_url, application_name=_APP, operation=operation) as conn,
        db_errors(operation),
    ):
        conn.execute(_statement(statement, database=sql.Identifier(name)))


class SessionDatabase:
    """A test session's migrated database: put back as it is now as often as asked, and
    read, on one connection kept for the session.

    Built right after the migrations: it reads what they left (rows, sequences, which
    triggers are on). Resets touch schema jobsd only; the caller's own schemas are the
    caller's.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._stack = ExitStack()
        self._conn: SyncConn | None = None
        self._reset = self._baseline()

    def _connection(self) -> SyncConn:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            self._stack.close()
            self._stack = ExitStack()
            conn = self._conn = self._stack.enter_context(
                connect(self._url, application_name=_APP, operation="reset of the test database")
            )
        return conn

    def _baseline(self) -> sql.Composed:
        """Read what the migrations left and return the reset's statements."""
        conn = self._connection()
        with db_errors("baseline of the test database"):
            tables = [r["name"] for r in conn.execute(_text("testing_tables")).fetchall()]
            parts: list[sql.Composable] = [sql.SQL(_text("testing_reset_begin"))]
            put_back: list[sql.Composable] = []
            for name in tables:
                table = sql.Identifier("jobsd", name)
                parts.append(_statement("testing_reset_table", table=table))
                row = conn.execute(_statement("testing_table_rows", table=table)).fetchone()
                if row is not None and row["rows"] != "[]":
                    put_back.append(
                        _statement("testing_reset_rows", table=table, rows=sql.Literal(row["rows"]))
                    )
            parts += put_back
            for seq in conn.execute(_text("testing_sequences")).fetchall():
                parts.append(
                    _statement(
                        "testing_reset_sequence",
                        sequence=sql.Literal(seq["name"]),
                        value=sql.Literal(seq["value"]),
                        called=sql.Literal(seq["called"]),
                    )
                )
            triggers = [r["name"] for r in conn.execute(_text("testing_enabled_triggers"))]
            parts.append(_statement("testing_reset_triggers", triggers=sql.Literal(triggers)))
        return sql.SQL("\n").join(parts)

    def reset(self) -> None:
        """Put the database back as it was after the migrations: one transaction."""

        def reset(conn: SyncConn) -> None:
            with conn.transaction():
                conn.execute(self._reset)

        self._on_connection("reset of the test database", reset)

    def list_jobs(self) -> list[Job]:
        """Return every job of the database, oldest first."""

        def jobs(conn: SyncConn) -> list[Job]:
            return [Job.from_row(r) for r in conn.execute(_text("testing_jobs")).fetchall()]

        return self._on_connection("listing of the test database's jobs", jobs)

    def _on_connection(self, operation: str, work: Callable[[SyncConn], T]) -> T:
        """Run ``work`` on the kept connection; once more on a new one if a test ended
        the session (``pg_terminate_backend``, a restart of the server)."""
        try:
            with db_errors(operation):
                return work(self._connection())
        except BackendUnavailable:
            self.close()
        with db_errors(operation):
            return work(self._connection())

    def close(self) -> None:
        """Close the connection (a later reset opens a new one)."""
        self._stack.close()
        self._conn = None


async def jobs_by_id(conn: AsyncConn, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Job]:
    """Read the jobs of ``ids`` (those that exist, open or archived), by id."""
    with db_errors(f"read of {len(ids)} jobs"):
        cur = await conn.execute(_text("testing_jobs_by_id"), {"ids": list(ids)})
        rows = await cur.fetchall()
    return {job.id: job for job in map(Job.from_row, rows)}


def database_url(server_url: str, name: str) -> str:
    """Return ``server_url`` pointing at the database ``name`` of the same server.

    A ``postgresql://`` URL stays a URL, a ``key=value`` string stays one; host, port,
    user, password and the other parameters are kept.
    """
    parts = urlsplit(server_url)
    if parts.scheme in ("postgresql", "postgres"):
        url = f"{parts.scheme}://{parts.netloc}/{quote(name, safe='')}"
        if parts.query:
            url += f"?{parts.query}"
    else:
        url = make_conninfo(server_url, dbname=name)
    if conninfo_to_dict(url).get("dbname") != name:  # a dbname in the query string wins
        url = make_conninfo(url, dbname=name)
    return url
