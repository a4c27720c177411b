"""jobsd: a Postgres-backed job queue with an asyncio worker daemon.

Enqueue from an application::

    job = await jobsd.enqueue("import_csv", {"file": "a.csv"}, org_id="acme")

Handle in the daemon (``JOBSD_HANDLERS=myapp.jobs jobsd run``)::

    @jobsd.handler("import_csv", max_attempts=3)
    async def import_csv(ctx: jobsd.JobContext) -> dict[str, int]:
        ...

Run it every night in the daemon's scheduler (``docs/periodic.md``)::

    @jobsd.periodic("30 2 * * *", type="purge", org_id="acme", timezone="Europe/Paris")
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from importlib import metadata
from typing import Any, Unpack

from pydantic import BaseModel

from jobsd.client import Client, SyncClient
from jobsd.context import JobContext
from jobsd.errors import (
    BackendUnavailable,
    ConfigError,
    JobNotFound,
    JobsdError,
    OutcomeUnknown,
    QueueFull,
    UnknownQueue,
)
from jobsd.jobspec import EnqueueOptions
from jobsd.models import ErrorRecord, Job, JobEvent, JobStatus
from jobsd.periodic import periodic
from jobsd.recovery import Recovery
from jobsd.registry import handler
from jobsd.retry import RetryPolicy, exponential_backoff
from jobsd.store import AsyncConn, SyncConn
from jobsd.task import Task

# What an application uses (README "Enqueue"); everything else has a module of its own:
# every error in jobsd.errors, EnqueueOptions and bulk specs (JobSpec) in jobsd.client,
# queue administration in jobsd.admin.queues, custom registries in jobsd.registry.
__all__ = [
    "BackendUnavailable",
    "Client",
    "ConfigError",
    "ErrorRecord",
    "Job",
    "JobContext",
    "JobEvent",
    "JobNotFound",
    "JobStatus",
    "JobsdError",
    "OutcomeUnknown",
    "QueueFull",
    "Recovery",
    "RetryPolicy",
    "SyncClient",
    "Task",
    "UnknownQueue",
    "__version__",
    "aclose",
    "close",
    "enqueue",
    "enqueue_sync",
    "exponential_backoff",
    "handler",
    "periodic",
]

try:
    __version__ = metadata.version("jobsd")
except metadata.PackageNotFoundError:  # a checkout that was never installed
    __version__ = "0+unknown"

# The default clients of ``enqueue`` and ``enqueue_sync``: one async client per event
# loop (a pool belongs to its loop; each is closed when its loop ends), one sync client
# per process (closed at exit). ``aclose()`` / ``close()`` close them earlier.
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Client] = (
    weakref.WeakKeyDictionary()
)
_sync_client: SyncClient | None = None
_sync_lock = threading.Lock()


def _default_client() -> Client:
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        client = _async_clients[loop] = Client()
    return client


def _default_sync_client() -> SyncClient:
    global _sync_client
    with _sync_lock:
        if _sync_client is None:
            _sync_client = SyncClient()
        return _sync_client


async def aclose() -> None:
    """Close the default async client of the running event loop (``jobsd.enqueue``'s).

    Optional: it is closed when its loop ends anyway. A later ``enqueue`` opens a new one.
    """
    client = _async_clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.close()


def close() -> None:
    """Close the default sync client (``jobsd.enqueue_sync``'s).

    Optional: it is closed at interpreter exit anyway. A later ``enqueue_sync`` opens
    a new one.
    """
    global _sync_client
    with _sync_lock:
        client, _sync_client = _sync_client, None
    if client is not None:
        client.close()


async def enqueue(
    type: str,
    payload: dict[str, Any] | BaseModel | None = None,
    *,
    org_id: str | None = None,
    conn: AsyncConn | None = None,
    **options: Unpack[EnqueueOptions],
) -> Job:
    """Enqueue a job with the default client (``JOBSD_DATABASE_URL``); see ``Client.enqueue``.

    ``payload`` is a dict or a pydantic model; ``org_id`` defaults to
    ``JOBSD_DEFAULT_ORG``. ``options`` are those of ``jobsd.client.EnqueueOptions``
    (queue, dedup_key, run_after, job_id, priority, concurrency_key, depends_on). With
    ``conn``, the job is inserted in the caller's transaction instead.
    """
    return await _default_client().enqueue(type, payload, org_id=org_id, conn=conn, **options)


def enqueue_sync(
    type: str,
    payload: dict[str, Any] | BaseModel | None = None,
    *,
    org_id: str | None = None,
    conn: SyncConn | None = None,
    **options: Unpack[EnqueueOptions],
) -> Job:
    """Enqueue a job from synchronous code; see ``SyncClient.enqueue``."""
    return _default_sync_client().enqueue(type, payload, org_id=org_id, conn=conn, **options)
