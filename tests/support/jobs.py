"""Jobs made directly in the database, in any state, and read back.

``make_job`` / ``make_jobs`` insert as the connection's role (the tests' superuser sees
every org), born ``queued``, ``scheduled`` or ``blocked``, then walk the state machine
by real status updates, so that the triggers check each edge and write the history
as they do for the daemon's own updates. Use them instead of writing an INSERT.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

TERMINAL = ("succeeded", "failed", "cancelled")
NON_TERMINAL = ("queued", "scheduled", "blocked", "running", "recovery_required")
BORN = ("queued", "scheduled", "blocked")

# the status updates that lead from the birth to each state
PATHS: dict[str, tuple[str, ...]] = {
    "queued": (),
    "scheduled": (),
    "blocked": (),
    "running": ("running",),
    "recovery_required": ("running", "recovery_required"),
    "succeeded": ("running", "succeeded"),
    "failed": ("running", "failed"),
    "cancelled": ("cancelled",),
}

NOW = sql.SQL("now()")
# a scheduled job is due well after any test ends, unless its run_after is given
SCHEDULED_RUN_AFTER = sql.SQL("now() + interval '1 day'")


def _value(conn: psycopg.Connection[Any], value: Any, params: list[Any]) -> sql.Composable:
    """A column value: an SQL expression as it is, anything else as a parameter.

    Parameters keep the statement's text the same from call to call, so psycopg
    prepares it once; the ``%`` of an expression is doubled for the same reason.
    """
    if isinstance(value, sql.Composable):
        return sql.SQL(value.as_string(conn).replace("%", "%%"))
    params.append(Jsonb(value) if isinstance(value, dict | list) else value)
    return sql.Placeholder()


def _assignments(
    conn: psycopg.Connection[Any], values: Mapping[str, Any], params: list[Any]
) -> sql.Composable:
    return sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(k), _value(conn, v, params))
        for k, v in values.items()
    )


def make_jobs(
    conn: psycopg.Connection[Any],
    count: int,
    *,
    status: str = "queued",
    claim: Mapping[str, Any] | None = None,
    **columns: Any,
) -> list[uuid.UUID]:
    """Insert ``count`` jobs in one statement, walk them to ``status``; return their ids.

    ``columns`` set columns of jobsd.jobs at the insert (defaults: org ``o``, type ``t``;
    a scheduled job's ``run_after`` is a day ahead). A value is sent as a parameter
    (a dict or list as jsonb), or written as it is when it is a ``psycopg.sql``
    expression, which may use ``g``, the row's number from 1 (``sql.SQL("g % 7")``).
    ``claim`` sets columns on the way into ``running``, as a claim does
    (``{"attempts": sql.SQL("attempts + 1"), "worker_id": "w1"}``).
    """
    if status not in PATHS:
        raise ValueError(f"no such status: {status!r}")
    born = status if status in BORN else "queued"
    values: dict[str, Any] = {"org_id": "o", "type": "t", **columns, "status": born}
    if born == "scheduled":
        values.setdefault("run_after", SCHEDULED_RUN_AFTER)
    params: list[Any] = []
    exprs = [_value(conn, v, params) for v in values.values()]
    insert = sql.SQL(
        "INSERT INTO jobsd.jobs ({}) SELECT {} FROM generate_series(1, %s) AS g RETURNING id"
    ).format(sql.SQL(", ").join(map(sql.Identifier, values)), sql.SQL(", ").join(exprs))
    ids: list[uuid.UUID] = [row[0] for row in conn.execute(insert, [*params, count])]
    for step in PATHS[status]:
        params = []
        sets = {"status": step, **((claim or {}) if step == "running" else {})}
        update = sql.SQL("UPDATE jobsd.jobs SET {} WHERE id = ANY(%s)").format(
            _assignments(conn, sets, params)
        )
        conn.execute(update, [*params, ids])
    return ids


def make_job(
    conn: psycopg.Connection[Any],
    *,
    status: str = "queued",
    claim: Mapping[str, Any] | None = None,
    **columns: Any,
) -> uuid.UUID:
    """Insert one job and walk it to ``status``; return its id (see ``make_jobs``)."""
    (job_id,) = make_jobs(conn, 1, status=status, claim=claim, **columns)
    return job_id


def job_row(conn: psycopg.Connection[Any], job_id: object) -> dict[str, Any] | None:
    """Read one row of jobsd.jobs as a dict (None if there is no such job)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM jobsd.jobs WHERE id = %s", (job_id,)).fetchone()


async def fetch_job(conn: psycopg.AsyncConnection[Any], job_id: object) -> dict[str, Any]:
    """Read one row of jobsd.jobs as a dict; fail if there is no such job."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT * FROM jobsd.jobs WHERE id = %s", (job_id,))
        row = await cur.fetchone()
    assert row is not None, f"job {job_id} not found"
    return row
