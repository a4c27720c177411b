"""Pause and resume a queue: an operator's acts, recorded in the audit with the actor."""

from __future__ import annotations

from jobsd.admin import queues as admin
from jobsd.errors import UnknownQueue
from jobsd.models import QueueInfo
from jobsd.ops.authority import Act, require
from jobsd.ops.caller import Caller
from jobsd.store.db import AsyncConn

__all__ = ["pause_queue", "resume_queue"]


def _known_name(name: str) -> str:
    """Return a queue name that can exist; UnknownQueue for one that cannot (no query)."""
    try:
        return admin.check_queue_name(name)
    except ValueError:
        raise UnknownQueue(name) from None


async def pause_queue(conn: AsyncConn, caller: Caller, name: str) -> QueueInfo:
    """Stop claims from the queue (running jobs finish); idempotent. Raises Forbidden
    (not an operator) and UnknownQueue."""
    require(caller, Act.ADMINISTER_QUEUES)
    queue = _known_name(name)
    return await admin.as_actor(conn, caller.actor, lambda c: admin.pause_queue(c, queue))


async def resume_queue(conn: AsyncConn, caller: Caller, name: str) -> QueueInfo:
    """Let daemons claim from the queue again, and wake them; idempotent. Raises
    Forbidden (not an operator) and UnknownQueue."""
    require(caller, Act.ADMINISTER_QUEUES)
    queue = _known_name(name)
    return await admin.as_actor(conn, caller.actor, lambda c: admin.resume_queue(c, queue))
