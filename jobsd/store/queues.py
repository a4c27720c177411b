"""One typed function per named statement of ``sql/queries/queues.sql``: queue administration.

Each runs through the SECURITY DEFINER functions of migration 0009 (it works under the
least-privilege enqueue role too, and counts every org's jobs). A change and the read
of the queue as changed share one transaction. Arguments arrive checked
(``jobsd.admin.queues``). ``queues_exists`` and ``queues_existing`` belong to the
enqueue plan (``store.enqueue``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobsd.errors import QueueExists, QueueNotEmpty, UnknownQueue
from jobsd.models import QueueInfo
from jobsd.store.db import AsyncConn, db_errors
from jobsd.store.named import run_named

__all__ = [
    "create",
    "drop",
    "get",
    "list_all",
    "pause",
    "resume",
    "set_actor",
    "set_limits",
    "set_org_limits",
]

LIMITS = ("capacity", "concurrency_limit", "retention_days")


async def set_actor(conn: AsyncConn, actor: str) -> None:
    """Name the actor of the transaction's changes (``admin_actions.actor``, history)."""
    with db_errors("naming the actor"):
        await run_named(conn, "admin_set_actor", {"worker_id": actor})


async def _info(conn: AsyncConn, name: str) -> QueueInfo:
    rows = await run_named(conn, "queues_info", {"name": name})
    if not rows:  # gone between the change and this read: only a concurrent drop does it
        raise UnknownQueue(name)
    return QueueInfo.from_row(rows[0])


async def _change(
    conn: AsyncConn, name: str, statement: str, params: dict[str, Any], operation: str
) -> QueueInfo:
    """Run a change that answers ``done``, then read the queue, in one transaction.

    Not done: the name is taken (``queues_create``) or unknown (the others).
    """
    with db_errors(operation):
        async with conn.transaction():
            rows = await run_named(conn, statement, {"name": name, **params})
            if not rows[0]["done"]:
                raise QueueExists(name) if statement == "queues_create" else UnknownQueue(name)
            return await _info(conn, name)


async def list_all(conn: AsyncConn) -> list[QueueInfo]:
    """Return every declared queue, by name, with its open jobs by state."""
    with db_errors("listing of the queues"):
        rows = await run_named(conn, "queues_info", {"name": None})
    return [QueueInfo.from_row(r) for r in rows]


async def get(conn: AsyncConn, name: str) -> QueueInfo:
    """Return one queue; raise UnknownQueue if it is not declared."""
    with db_errors(f"read of queue {name!r}"):
        return await _info(conn, name)


async def create(conn: AsyncConn, name: str, limits: Mapping[str, int | None]) -> QueueInfo:
    """Declare a queue with ``limits`` (None or left out: unset); raise QueueExists if taken."""
    params = {field: limits.get(field) for field in LIMITS}
    return await _change(conn, name, "queues_create", params, f"creation of queue {name!r}")


async def set_limits(conn: AsyncConn, name: str, changes: Mapping[str, int | None]) -> QueueInfo:
    """Set the limits in ``changes`` (None removes one), leave the others; raise UnknownQueue."""
    params: dict[str, Any] = {}
    for field in LIMITS:
        params[f"set_{field}"] = field in changes
        params[field] = changes.get(field)
    operation = f"change of the limits of queue {name!r}"
    return await _change(conn, name, "queues_set_limits", params, operation)


async def set_org_limits(conn: AsyncConn, name: str, changes: Mapping[str, int | None]) -> None:
    """Set ``org_running_limit`` / ``org_open_limit`` in ``changes``; raise UnknownQueue."""
    params: dict[str, Any] = {
        "name": name,
        "set_running": "org_running_limit" in changes,
        "org_running_limit": changes.get("org_running_limit"),
        "set_open": "org_open_limit" in changes,
        "org_open_limit": changes.get("org_open_limit"),
    }
    with db_errors(f"change of the per-org limits of queue {name!r}"):
        rows = await run_named(conn, "queues_set_org_limits", params)
    if not rows[0]["done"]:
        raise UnknownQueue(name)


async def pause(conn: AsyncConn, name: str) -> QueueInfo:
    """Stop claims from the queue; keep the first ``paused_at``; raise UnknownQueue."""
    return await _change(conn, name, "queues_pause", {}, f"pause of queue {name!r}")


async def resume(conn: AsyncConn, name: str) -> QueueInfo:
    """Let daemons claim from the queue and wake them (NOTIFY at commit); raise UnknownQueue."""
    return await _change(conn, name, "queues_resume", {}, f"resume of queue {name!r}")


async def drop(conn: AsyncConn, name: str) -> int:
    """Delete a queue without open jobs, with its finished jobs; return how many.

    Raises UnknownQueue, QueueNotEmpty (nothing deleted).
    """
    with db_errors(f"drop of queue {name!r}"):
        rows = await run_named(conn, "queues_drop", {"name": name})
    row = rows[0]
    if not row["queue_found"]:
        raise UnknownQueue(name)
    if row["open_jobs"]:
        raise QueueNotEmpty(name, int(row["open_jobs"]))
    return int(row["deleted_jobs"])
