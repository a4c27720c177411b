"""What the dashboard's overview and ``jobsd top`` show, read within the caller's scope.

An operator sees every org's counts, the daemons and every org's failures; an org's
caller sees its own jobs' counts and failures, and no daemon (the daemons run every
org's jobs). The queues themselves (names, limits, paused) are shown to all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobsd.admin.queues import list_queues
from jobsd.models import QueueInfo
from jobsd.ops.authority import Act, may
from jobsd.ops.caller import Caller
from jobsd.store import ui as store
from jobsd.store.db import AsyncConn

__all__ = ["Overview", "read_overview"]


@dataclass(frozen=True, slots=True)
class Overview:
    """One read of the overview: the queues, the caller's counts by queue and state
    (None: every org's, in ``QueueInfo.depth``), pickup lag by queue, finished jobs
    per queue and minute, the daemons (None: not the caller's to see) and the latest
    failures."""

    queues: list[QueueInfo]
    own_counts: dict[str, dict[str, int]] | None
    lags: dict[str, float | None]
    minutes: list[dict[str, Any]]
    workers: list[dict[str, Any]] | None
    failures: list[dict[str, Any]]


async def read_overview(
    conn: AsyncConn, caller: Caller, *, minutes: int, failures: int
) -> Overview:
    """Read the overview as ``caller`` may see it: ``minutes`` of throughput, the last
    ``failures`` failed jobs."""
    scope = caller.scope
    every_org = may(caller, Act.SEE_EVERY_ORG)
    return Overview(
        queues=await list_queues(conn),
        own_counts=None if scope is None else await store.open_counts_for_org(conn, scope),
        lags=await store.pickup_lag(conn, scope),
        minutes=await store.throughput(conn, scope, minutes=minutes),
        workers=await store.workers(conn) if every_org else None,
        failures=await store.recent_failures(conn, scope, limit=failures),
    )
