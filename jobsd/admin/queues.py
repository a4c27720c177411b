"""Declare and administer queues: create, change limits, list, pause, resume, drop.

Every function takes an async connection (jobsd's own, or a caller's: then the
change commits with the caller's transaction) and checks its arguments first: a bad
name or limit is a ValueError, and nothing reaches the database. The statements are
``jobsd.store.queues``: through the SECURITY DEFINER functions of migration 0009, so
they work under the least-privilege enqueue role too and the depth of a queue counts
every org's jobs.

Semantics (docs/queues.md): a pause stops new claims from the queue at once (running
jobs finish); a resume wakes idle daemons with ``NOTIFY jobsd, '<queue>'``; both are
idempotent. A capacity may be set below the number of open jobs: enqueues are then
refused until enough of them finish. A queue is dropped only when it holds no open
job, together with its finished jobs; ``default`` is never dropped.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Awaitable, Callable
from typing import TypedDict, TypeVar, Unpack

from jobsd.models import OPEN_STATES, QUEUE_NAME_PATTERN, QueueInfo
from jobsd.store import queues as store
from jobsd.store.db import AsyncConn

T = TypeVar("T")

__all__ = [
    "DEFAULT_QUEUE",
    "OPEN_STATES",
    "UNCHANGED",
    "QueueInfo",
    "QueueLimits",
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
    "org_running_limit": (1, "running jobs of one org at most"),
    "org_open_limit": (1, "open jobs of one org at most"),
}


class Unchanged(enum.Enum):
    """The type of ``UNCHANGED``: leave a limit as it is (as leaving it out does)."""

    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED


class QueueLimits(TypedDict, total=False):
    """A queue's limits, each optional; None is unset (left out: unchanged, or unset)."""

    capacity: int | Unchanged | None
    """Open jobs at most; enqueues beyond it are refused (QueueFull)."""
    concurrency_limit: int | Unchanged | None
    """Running jobs of one concurrency key at most (None: the default, 1)."""
    retention_days: int | Unchanged | None
    """Days ``jobsd prune`` keeps finished jobs (None: until deleted)."""


def _checked(limits: QueueLimits) -> dict[str, int | None]:
    """Check the limits given; leave out those left out or ``UNCHANGED``."""
    unknown = sorted(set(limits) - set(QueueLimits.__annotations__))
    if unknown:
        raise TypeError(f"unknown queue limit {unknown[0]!r}")
    return {
        field: check_limit(field, value)
        for field, value in limits.items()
        if not isinstance(value, Unchanged)
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


async def create_queue(conn: AsyncConn, name: str, **limits: Unpack[QueueLimits]) -> QueueInfo:
    """Declare a queue with the limits given and return it; raise QueueExists if taken."""
    return await store.create(conn, check_queue_name(name), _checked(limits))


async def set_queue_limits(conn: AsyncConn, name: str, **changes: Unpack[QueueLimits]) -> QueueInfo:
    """Change the limits given (None removes one), leave the others; return the queue.

    A capacity below the queue's open jobs is accepted: enqueues are refused until
    fewer jobs are open than the capacity. Raises UnknownQueue.
    """
    return await store.set_limits(conn, check_queue_name(name), _checked(changes))


async def as_actor(conn: AsyncConn, actor: str, fn: Callable[[AsyncConn], Awaitable[T]]) -> T:
    """Run ``fn(conn)`` in one transaction whose changes the audit gives to ``actor``.

    ``jobsd.admin_actions`` records every change of a queue with the database role and
    this actor (e.g. ``token:<id>`` for the API's operator tokens).
    """
    async with conn.transaction():
        await store.set_actor(conn, actor)
        return await fn(conn)


async def set_org_limits(
    conn: AsyncConn,
    name: str,
    *,
    org_running_limit: object = ...,
    org_open_limit: object = ...,
) -> None:
    """Set the limits each org has on the queue (None removes one; left out: unchanged).

    ``org_running_limit``: running jobs of one org at most (claims skip an org at its
    limit). ``org_open_limit``: open jobs of one org at most (an enqueue beyond it is
    refused with OrgQuotaExceeded). Raises UnknownQueue, ValueError for a bad limit.
    """
    changes = {
        field: check_limit(field, value)
        for field, value in (
            ("org_running_limit", org_running_limit),
            ("org_open_limit", org_open_limit),
        )
        if value is not ...
    }
    await store.set_org_limits(conn, check_queue_name(name), changes)


async def list_queues(conn: AsyncConn) -> list[QueueInfo]:
    """Return every declared queue, by name, with its open jobs by state."""
    return await store.list_all(conn)


async def unhandled_jobs(conn: AsyncConn) -> dict[str, dict[str, int]]:
    """Count queued jobs of types no live daemon handles: queue -> type -> jobs."""
    from jobsd.store.api import unhandled_jobs as count

    found: dict[str, dict[str, int]] = {}
    for queue, type_, jobs in await count(conn, timeout_s=10.0):
        found.setdefault(queue, {})[type_] = jobs
    return found


async def get_queue(conn: AsyncConn, name: str) -> QueueInfo:
    """Return one queue; raise UnknownQueue if it is not declared."""
    return await store.get(conn, check_queue_name(name))


async def pause_queue(conn: AsyncConn, name: str) -> QueueInfo:
    """Stop claims from the queue (running jobs finish); return it.

    Idempotent: pausing a paused queue keeps its first ``paused_at``. Raises UnknownQueue.
    """
    return await store.pause(conn, check_queue_name(name))


async def resume_queue(conn: AsyncConn, name: str) -> QueueInfo:
    """Let daemons claim from the queue again and wake them (NOTIFY at commit); return it.

    Idempotent: resuming a queue that is not paused changes nothing (it still wakes
    the daemons). Raises UnknownQueue.
    """
    return await store.resume(conn, check_queue_name(name))


async def drop_queue(conn: AsyncConn, name: str) -> int:
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
    return await store.drop(conn, name)
