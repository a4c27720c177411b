"""Declare and administer queues: create, change limits, list, pause, resume, drop.

Every function takes a psycopg async connection (jobsd's own, or a caller's: then the
change commits with the caller's transaction) and runs through the SECURITY DEFINER
functions of migration 0009, so it works under the least-privilege enqueue role too
and the depth of a queue counts every org's jobs. Arguments are checked here first:
a bad name or limit is a ValueError, and nothing reaches the database.

Semantics (docs/queues.md): a pause stops new claims from the queue at once (running
jobs finish); a resume wakes idle daemons with ``NOTIFY jobsd, '<queue>'``; both are
idempotent. A capacity may be set below the number of open jobs: enqueues are then
refused until enough of them finish. A queue is dropped only when it holds no open
job, together with its finished jobs; ``default`` is never dropped.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from jobsd.errors import QueueExists, QueueNotEmpty, UnknownQueue
from jobsd.models import OPEN_STATES, QUEUE_NAME_PATTERN
from jobsd.store.db import db_errors
from jobsd.store.queries import run_named

__all__ = [
    "DEFAULT_QUEUE",
    "OPEN_STATES",
    "UNCHANGED",
    "QueueInfo",
    "Unchanged",
    "check_limit",
    "check_queue_name",
    "create_queue",
    "drop_queue",
    "get_queue",
    "list_queues",
    "pause_queue",
    "resume_queue",
    "set_queue_limits",
]

DEFAULT_QUEUE = "default"
_NAME = re.compile(QUEUE_NAME_PATTERN)
_INT_MAX = 2**31 - 1  # the limits are Postgres integers
# (minimum, what the limit is) of each limit; retention 0 keeps finished jobs no time
_LIMITS = {
    "capacity": (1, "open jobs at most"),
    "concurrency_limit": (1, "running jobs of one concurrency key at most"),
    "retention_days": (0, "days finished jobs are kept"),
}


class Unchanged(enum.Enum):
    """The type of ``UNCHANGED``: leave a limit as it is."""

    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A declared queue: its limits, whether it is paused, and its open jobs by state.

    A limit of None is unset: no capacity, the default concurrency limit, finished
    jobs kept until deleted. The counts are every org's jobs, read in one statement.
    """

    name: str
    created_at: datetime
    paused_at: datetime | None
    capacity: int | None
    concurrency_limit: int | None
    retention_days: int | None
    queued: int
    scheduled: int
    blocked: int
    running: int
    recovery_required: int

    @property
    def paused(self) -> bool:
        """Say whether claims from this queue are stopped."""
        return self.paused_at is not None

    @property
    def depth(self) -> dict[str, int]:
        """Return the open jobs by state, in the order of ``OPEN_STATES``."""
        return {state: int(getattr(self, state)) for state in OPEN_STATES}

    @property
    def open_jobs(self) -> int:
        """Return the number of jobs not yet finished (what the capacity counts)."""
        return sum(self.depth.values())

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> QueueInfo:
        """Build from a row of ``jobsd.queue_info()``."""
        return cls(**{k: row[k] for k in cls.__slots__})

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict (times in ISO 8601), as ``jobsd queue list --json``."""
        return {
            "name": self.name,
            "paused": self.paused,
            "paused_at": self.paused_at.isoformat() if self.paused_at else None,
            "capacity": self.capacity,
            "concurrency_limit": self.concurrency_limit,
            "retention_days": self.retention_days,
            "created_at": self.created_at.isoformat(),
            "depth": self.depth,
        }


def check_queue_name(name: object) -> str:
    """Return ``name`` if it is a valid queue name, else raise ValueError saying why."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise ValueError(
            f"invalid queue name {name!r}: use 1 to 63 letters, digits and _ . : - "
            "(starting with a letter or a digit)"
        )
    return name


def check_limit(field: str, value: object) -> int | None:
    """Return ``value`` if it is a valid ``field`` (None: unset), else raise ValueError."""
    minimum, meaning = _LIMITS[field]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= _INT_MAX:
        kind = "a positive integer" if minimum == 1 else "an integer >= 0"
        raise ValueError(
            f"{field} ({meaning}) must be {kind} (at most {_INT_MAX}) or None, not {value!r}"
        )
    return value


async def _info(conn: psycopg.AsyncConnection[Any], name: str) -> QueueInfo:
    rows = await run_named(conn, "queues_info", {"name": name})
    if not rows:  # gone between the change and this read: only a concurrent drop does it
        raise UnknownQueue(name)
    return QueueInfo.from_row(rows[0])


async def create_queue(
    conn: psycopg.AsyncConnection[Any],
    name: str,
    *,
    capacity: int | None = None,
    concurrency_limit: int | None = None,
    retention_days: int | None = None,
) -> QueueInfo:
    """Declare a queue and return it; raise QueueExists if the name is taken."""
    params = {
        "name": check_queue_name(name),
        "capacity": check_limit("capacity", capacity),
        "concurrency_limit": check_limit("concurrency_limit", concurrency_limit),
        "retention_days": check_limit("retention_days", retention_days),
    }
    with db_errors(f"creation of queue {name!r}"):
        async with conn.transaction():
            rows = await run_named(conn, "queues_create", params)
            if not rows[0]["done"]:
                raise QueueExists(name)
            return await _info(conn, name)


async def set_queue_limits(
    conn: psycopg.AsyncConnection[Any],
    name: str,
    *,
    capacity: int | Unchanged | None = UNCHANGED,
    concurrency_limit: int | Unchanged | None = UNCHANGED,
    retention_days: int | Unchanged | None = UNCHANGED,
) -> QueueInfo:
    """Change the limits given (None removes one), leave the others; return the queue.

    A capacity below the queue's open jobs is accepted: enqueues are refused until
    fewer jobs are open than the capacity. Raises UnknownQueue.
    """
    params: dict[str, Any] = {"name": check_queue_name(name)}
    for field, value in (
        ("capacity", capacity),
        ("concurrency_limit", concurrency_limit),
        ("retention_days", retention_days),
    ):
        given = value is not UNCHANGED
        params[f"set_{field}"] = given
        params[field] = check_limit(field, value) if given else None
    with db_errors(f"change of the limits of queue {name!r}"):
        async with conn.transaction():
            rows = await run_named(conn, "queues_set_limits", params)
            if not rows[0]["done"]:
                raise UnknownQueue(name)
            return await _info(conn, name)


async def list_queues(conn: psycopg.AsyncConnection[Any]) -> list[QueueInfo]:
    """Return every declared queue, by name, with its open jobs by state."""
    with db_errors("listing of the queues"):
        rows = await run_named(conn, "queues_info", {"name": None})
    return [QueueInfo.from_row(r) for r in rows]


async def get_queue(conn: psycopg.AsyncConnection[Any], name: str) -> QueueInfo:
    """Return one queue; raise UnknownQueue if it is not declared."""
    check_queue_name(name)
    with db_errors(f"read of queue {name!r}"):
        return await _info(conn, name)


async def pause_queue(conn: psycopg.AsyncConnection[Any], name: str) -> QueueInfo:
    """Stop claims from the queue (running jobs finish); return it.

    Idempotent: pausing a paused queue keeps its first ``paused_at``. Raises UnknownQueue.
    """
    check_queue_name(name)
    with db_errors(f"pause of queue {name!r}"):
        async with conn.transaction():
            rows = await run_named(conn, "queues_pause", {"name": name})
            if not rows[0]["done"]:
                raise UnknownQueue(name)
            return await _info(conn, name)


async def resume_queue(conn: psycopg.AsyncConnection[Any], name: str) -> QueueInfo:
    """Let daemons claim from the queue again and wake them (NOTIFY at commit); return it.

    Idempotent: resuming a queue that is not paused changes nothing (it still wakes
    the daemons). Raises UnknownQueue.
    """
    check_queue_name(name)
    with db_errors(f"resume of queue {name!r}"):
        async with conn.transaction():
            rows = await run_named(conn, "queues_resume", {"name": name})
            if not rows[0]["done"]:
                raise UnknownQueue(name)
            return await _info(conn, name)


async def drop_queue(conn: psycopg.AsyncConnection[Any], name: str) -> int:
    """Delete a queue that holds no open job, with its finished jobs; return how many.

    One transaction, the queue row locked first: an enqueue that committed before is
    counted (QueueNotEmpty, nothing deleted), one that comes after fails with
    UnknownQueue. Raises UnknownQueue, QueueNotEmpty, and ValueError for ``default``.
    """
    check_queue_name(name)
    if name == DEFAULT_QUEUE:
        raise ValueError(
            f"the queue {DEFAULT_QUEUE!r} cannot be dropped: enqueues without a queue use "
            "it; pause it instead"
        )
    with db_errors(f"drop of queue {name!r}"):
        rows = await run_named(conn, "queues_drop", {"name": name})
    row = rows[0]
    if not row["queue_found"]:
        raise UnknownQueue(name)
    if row["open_jobs"]:
        raise QueueNotEmpty(name, int(row["open_jobs"]))
    return int(row["deleted_jobs"])
