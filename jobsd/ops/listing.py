"""List jobs newest first, one page at a time, within the caller's scope."""

from __future__ import annotations

from typing import Unpack

from jobsd.ops.caller import Caller
from jobsd.store import jobs_ops as store
from jobsd.store.db import AsyncConn, SyncConn
from jobsd.store.jobs_ops import Cursor, JobPage, ListOptions

__all__ = ["Cursor", "JobPage", "ListOptions", "list_jobs", "list_jobs_sync"]


def _scoped(caller: Caller, options: ListOptions) -> ListOptions | None:
    """Return the options with the caller's org; None when they ask for another org's
    jobs, which an org's caller never sees (an empty page, as for an org with none)."""
    allowed, org_id = caller.org_to_read(options.get("org_id"))
    if not allowed:
        return None
    return options if caller.operator else {**options, "org_id": org_id}


async def list_jobs(conn: AsyncConn, caller: Caller, **options: Unpack[ListOptions]) -> JobPage:
    """List jobs (``ListOptions``: status, type, queue, org_id, since, after, limit);
    an operator's of every org unless ``org_id``, anyone else's of its own org.
    Raises ValueError for a bad filter."""
    scoped = _scoped(caller, options)
    if scoped is None:
        store.check_list_options(**options)
        return JobPage([], None)
    return await store.list_jobs(conn, **scoped)


def list_jobs_sync(conn: SyncConn, caller: Caller, **options: Unpack[ListOptions]) -> JobPage:
    """List jobs; see ``list_jobs`` (sync)."""
    scoped = _scoped(caller, options)
    if scoped is None:
        store.check_list_options(**options)
        return JobPage([], None)
    return store.list_jobs_sync(conn, **scoped)
