"""Run the named statements of ``sql/queries`` (private to ``jobsd.store``).

Code outside ``jobsd.store`` calls the typed function of a statement (``store.queries``,
``store.api``, ...), never a statement by its name. Connections may be jobsd's own
(dict rows) or a caller's (any row factory): every run opens its own dict-row cursor.
"""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg
from psycopg.pq import ExecStatus
from psycopg.pq.abc import PGresult
from psycopg.rows import dict_row, tuple_row

from jobsd.store.sqlfiles import load_queries

__all__ = ["Row", "run_named", "run_named_sync", "run_named_tuples", "sql_text"]

Row = dict[str, Any]


def sql_text(name: str) -> LiteralString:
    """Return the text of the named statement ``name``."""
    # The text comes from our own shipped files, never from input.
    return load_queries()[name]


async def run_named(
    conn: psycopg.AsyncConnection[Any], name: str, params: dict[str, Any]
) -> list[Row]:
    """Execute a named statement on an async connection and return its rows as dicts."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql_text(name), params)
        return await cur.fetchall() if cur.description else []


async def run_named_tuples(
    conn: psycopg.AsyncConnection[Any],
    name: str,
    params: dict[str, Any],
    *,
    prepare: bool | None = None,
) -> list[tuple[Any, ...]]:
    """Execute a named statement on an async connection and return its rows as tuples
    (cheaper than dicts where many rows come back). ``prepare``: psycopg's (None:
    prepared from its fifth run on the connection; True: at once)."""
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(sql_text(name), params, prepare=prepare)
        # the result's status, not ``cur.description``: tuples need no column objects
        # (building them costs more than decoding a small claim's rows)
        return await cur.fetchall() if _has_rows(cur.pgresult) else []


def run_named_sync(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> list[Row]:
    """Execute a named statement on a sync connection and return its rows as dicts."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql_text(name), params)
        return cur.fetchall() if cur.description else []


def _has_rows(result: PGresult | None) -> bool:
    return result is not None and result.status == ExecStatus.TUPLES_OK
