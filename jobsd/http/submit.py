"""Submit one job for one org: ``jobsd.client``'s enqueue plan, each step scoped by org.

The plan (insert, or find the holder of the id or the dedup key) is the client's;
this module drives it the way ``jobsd.Client`` does on its own pool, with one
difference: every statement runs through ``queries.run_for_org``, so under the
enqueue role row-level security accepts the insert and shows the re-reads. Each
statement is its own implicit transaction, committed before the next is sent, and
still one round trip.

A dropped connection is retried with the same job id (the API always fixes the id
before the first attempt), so a retry can never create a second job; when the
outcome stays unknown the caller hears so (``OutcomeUnknown``).
"""

from __future__ import annotations

from typing import Any

import anyio

from jobsd.client import JobSpec, run_enqueue
from jobsd.errors import BackendUnavailable, OutcomeUnknown
from jobsd.http.queries import run_for_org
from jobsd.models import Job
from jobsd.store.db import AsyncConn, AsyncPool, acquire

__all__ = ["submit"]

# attempts when the connection drops between or during statements
_CONNECTION_TRIES = 3


async def submit(pool: AsyncPool, spec: JobSpec) -> Job:
    """Create the job of ``spec`` (or return the one holding its id or dedup key).

    Raises UnknownQueue, DuplicateJob (the id belongs to another org's job),
    BackendUnavailable (no job was created), OutcomeUnknown (retry with the same id)
    or DatabaseError (e.g. the role may not insert).
    """
    operation = f"enqueue of {spec.type!r} into queue {spec.queue!r}"
    sent = False
    for attempt in range(1, _CONNECTION_TRIES + 1):
        connected = False
        try:
            async with acquire(pool, operation) as conn:
                connected = sent = True
                return await _run(conn, spec, operation)
        except BackendUnavailable as exc:
            if attempt == _CONNECTION_TRIES or not connected:
                if sent and spec.id_may_exist:
                    raise OutcomeUnknown(
                        f"enqueue of job {spec.id} could not be confirmed: "
                        f"retry with the same job id ({exc})"
                    ) from exc.__cause__
                raise
            await anyio.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


async def _run(conn: AsyncConn, spec: JobSpec, operation: str) -> Job:
    async def scoped(c: AsyncConn, name: str, params: dict[str, Any]) -> list[Any]:
        return await run_for_org(c, spec.org_id, name, params)

    return await run_enqueue(conn, spec, operation, scoped)
