"""The enqueue's insert sent through libpq directly (private to ``jobsd.store``).

``jobs_insert`` is the statement a web application runs once per request. Through a
psycopg cursor its client side cost about 200 µs of CPU (placeholder conversion,
adaptation of eleven parameters, the cursor, column descriptions and row making),
more than the whole enqueue of a peer on asyncpg. Here the statement is prepared
once per connection under its own name (positional placeholders made from the named
ones), its parameters are sent as text and its four result columns come back in
binary: the same statement, the same server work, a fifth less of the client's CPU
per enqueue, a quarter less on the sync client (``docs/decisions.md``, "The enqueue's
insert on libpq").

Only for jobsd's own autocommit pool connections (async and sync), where nothing else
runs on the connection meanwhile (its lock is held). A parameter this encoder does not
know, a string libpq cannot carry (a NUL) or a connection not in UTF-8 or not idle
returns ``None``: the caller runs the statement through psycopg, which gives its usual
answer.
"""

from __future__ import annotations

import asyncio
import re
import select
import struct
import uuid
import weakref
from collections.abc import Generator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg import pq

from jobsd.store.sqlfiles import load_queries

__all__ = ["run_jobs_insert", "run_jobs_insert_sync"]

_T = TypeVar("_T")
_AnyConn = psycopg.AsyncConnection[Any] | psycopg.Connection[Any]

_NAME = "jobs_insert"
_PREPARED_NAME = b"jobsd_jobs_insert_v1"
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
_INVALID_STATEMENT_NAME = b"26000"  # invalid_sql_statement_name
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_INT64 = struct.Struct("!q")

# connections whose session holds the prepared statement
_prepared: weakref.WeakSet[_AnyConn] = weakref.WeakSet()


def _positional(text: str) -> tuple[bytes, tuple[str, ...]]:
    """Turn ``%(name)s`` placeholders into ``$n``, first seen first; return the text
    and the parameter names in ``$n`` order."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    return _PLACEHOLDER.sub(number, text).encode(), tuple(order)


_TEXT, _ORDER = _positional(load_queries()[_NAME])


def _encode(value: object) -> bytes | None:
    """Return ``value`` as a text parameter, or raise ValueError when it is not one of
    the insert's kinds or cannot travel as a C string."""
    if value is None:
        return None
    if value is True:
        return b"t"
    if value is False:
        return b"f"
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("NUL")
        return value.encode()  # a lone surrogate raises UnicodeEncodeError, a ValueError
    if isinstance(value, int | uuid.UUID):
        return str(value).encode()
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.isoformat().encode()
    raise ValueError(type(value).__name__)


def _timestamp(raw: bytes | None) -> datetime:
    assert raw is not None  # run_after and created_at are NOT NULL
    return _EPOCH + timedelta(microseconds=_INT64.unpack(raw)[0])


_READ, _WRITE = 1, 2  # what a step of the conversation waits for


def _conversation(pgconn: pq.abc.PGconn) -> Generator[int, None, list[pq.abc.PGresult]]:
    """Flush what was sent, read the whole answer and return its results; yields what it
    waits for (``_READ`` or ``_WRITE``), for a driver to wait on. As psycopg's own
    fetch: a connection that drops after an error result ends the answer there."""
    while pgconn.flush():
        yield _WRITE
    results: list[pq.abc.PGresult] = []
    while True:
        try:
            while pgconn.is_busy():
                yield _READ
                pgconn.consume_input()
        except psycopg.DatabaseError:
            if any(r.status == pq.ExecStatus.FATAL_ERROR for r in results):
                return results
            raise
        result = pgconn.get_result()
        if result is None:
            return results
        results.append(result)


def _outcome(results: list[pq.abc.PGresult], ok: pq.ExecStatus) -> pq.abc.PGresult | None:
    """Return the ``ok`` result of an answer; None when the session had no such prepared
    statement; otherwise raise the first error, as psycopg does."""
    for result in results:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            if result.error_field(pq.DiagnosticField.SQLSTATE) == _INVALID_STATEMENT_NAME:
                return None
            raise psycopg.errors.error_from_result(result, encoding="utf-8")
    for result in results:
        if result.status == ok:
            return result
    raise psycopg.InternalError(f"no {ok.name} result among {[r.status for r in results]}")


def _insert(conn: _AnyConn, values: list[bytes | None]) -> Generator[int, None, pq.abc.PGresult]:
    """Prepare the insert on ``conn`` unless done, run it, return its result."""
    pgconn = conn.pgconn
    for _ in range(2):
        if conn not in _prepared:
            pgconn.send_prepare(_PREPARED_NAME, _TEXT)
            if _outcome((yield from _conversation(pgconn)), pq.ExecStatus.COMMAND_OK):
                _prepared.add(conn)
        pgconn.send_query_prepared(_PREPARED_NAME, values, result_format=pq.Format.BINARY)
        result = _outcome((yield from _conversation(pgconn)), pq.ExecStatus.TUPLES_OK)
        if result is not None:
            return result
        # the session lost its prepared statements (DISCARD ALL, DEALLOCATE): again
        _prepared.discard(conn)
    raise psycopg.OperationalError("the insert's prepared statement vanished twice")


async def _run_async(steps: Generator[int, None, _T], fd: int) -> _T:
    loop = asyncio.get_running_loop()
    try:
        wait = next(steps)
        while True:
            ready = loop.create_future()
            if wait == _READ:
                loop.add_reader(fd, ready.set_result, None)
            else:
                loop.add_writer(fd, ready.set_result, None)
            try:
                await ready
            finally:
                (loop.remove_reader if wait == _READ else loop.remove_writer)(fd)
            wait = steps.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _run_sync(steps: Generator[int, None, _T], fd: int) -> _T:
    poller = select.poll()
    try:
        wait = next(steps)
        while True:
            poller.register(fd, select.POLLIN if wait == _READ else select.POLLOUT)
            poller.poll()
            poller.unregister(fd)
            wait = steps.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _values(conn: _AnyConn, params: dict[str, Any]) -> list[bytes | None] | None:
    """The insert's parameters as text, or None where psycopg is to send them."""
    if conn.info.encoding != "utf-8" or conn.info.transaction_status != pq.TransactionStatus.IDLE:
        return None
    try:
        return [_encode(params[name]) for name in _ORDER]
    except ValueError:
        return None


def _rows(conn: _AnyConn, result: pq.abc.PGresult) -> list[dict[str, Any]]:
    tz = conn.info.timezone
    rows = []
    for i in range(result.ntuples):
        raw_id, status = result.get_value(i, 0), result.get_value(i, 1)
        assert raw_id is not None and status is not None
        rows.append(
            {
                "id": uuid.UUID(bytes=raw_id),
                "status": status.decode(),
                "run_after": _timestamp(result.get_value(i, 2)).astimezone(tz),
                "created_at": _timestamp(result.get_value(i, 3)).astimezone(tz),
            }
        )
    return rows


async def run_jobs_insert(
    conn: psycopg.AsyncConnection[Any], params: dict[str, Any]
) -> list[dict[str, Any]] | None:
    """Run ``jobs_insert`` with ``params`` on an idle connection of jobsd's own pool;
    return its rows (id, status, run_after, created_at), or None when the statement is
    to go through psycopg instead.

    A database error is raised as psycopg raises it (``db_errors`` translates it).
    """
    values = _values(conn, params)
    if values is None:
        return None
    async with conn.lock:
        result = await _run_async(_insert(conn, values), conn.pgconn.socket)
    return _rows(conn, result)


def run_jobs_insert_sync(
    conn: psycopg.Connection[Any], params: dict[str, Any]
) -> list[dict[str, Any]] | None:
    """Run ``jobs_insert`` on a sync connection of jobsd's own pool; see
    ``run_jobs_insert``."""
    values = _values(conn, params)
    if values is None:
        return None
    with conn.lock:
        result = _run_sync(_insert(conn, values), conn.pgconn.socket)
    return _rows(conn, result)
