"""jobsd: a Postgres-backed job queue with an asyncio worker daemon.

Enqueue from an application::

    job = await jobsd.enqueue("import_csv", {"file": "a.csv"}, org_id="acme")

Handle in the daemon (``JOBSD_HANDLERS=myapp.jobs jobsd run``)::

    @jobsd.handler("import_csv", max_attempts=3)
    async def import_csv(ctx: jobsd.JobContext) -> dict[str, int]:
        ...
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import psycopg

from jobsd.admin.queues import QueueInfo
from jobsd.client import Client, JobSpec, SyncClient
from jobsd.context import JobContext
from jobsd.errors import (
    AlreadyClaimed,
    BackendUnavailable,
    ConfigError,
    DatabaseError,
    DuplicateJob,
    InvalidPayload,
    JobNotFound,
    JobsdError,
    LeaseLost,
    MigrationError,
    OutcomeUnknown,
    PayloadTooLarge,
    QueueExists,
    QueueFull,
    QueueNotEmpty,
    TransientConflict,
    UnknownDependency,
    UnknownJobKind,
    UnknownQueue,
)
from jobsd.models import Job, JobEvent, JobStatus
from jobsd.recovery import Recovery
from jobsd.registry import HandlerSpec, Registry, default_registry, handler
from jobsd.retry import RetryPolicy, exponential_backoff

__all__ = [
    "AlreadyClaimed",
    "BackendUnavailable",
    "Client",
    "ConfigError",
    "DatabaseError",
    "DuplicateJob",
    "HandlerSpec",
    "InvalidPayload",
    "Job",
    "JobContext",
    "JobEvent",
    "JobNotFound",
    "JobSpec",
    "JobStatus",
    "JobsdError",
    "LeaseLost",
    "MigrationError",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "QueueExists",
    "QueueFull",
    "QueueInfo",
    "QueueNotEmpty",
    "Recovery",
    "Registry",
    "RetryPolicy",
    "SyncClient",
    "TransientConflict",
    "UnknownDependency",
    "UnknownJobKind",
    "UnknownQueue",
    "default_registry",
    "enqueue",
    "enqueue_sync",
    "exponential_backoff",
    "handler",
]

_async_client: Client | None = None
_sync_client: SyncClient | None = None


async def enqueue(
    type: str,
    payload: dict[str, Any] | None = None,
    *,
    org_id: str,
    queue: str = "default",
    dedup_key: str | None = None,
    run_after: datetime | None = None,
    job_id: uuid.UUID | str | None = None,
    priority: int = 0,
    concurrency_key: str | None = None,
    depends_on: Iterable[uuid.UUID | str] = (),
    conn: psycopg.AsyncConnection[Any] | None = None,
) -> Job:
    """Enqueue a job with the default client (``JOBSD_DATABASE_URL``); see ``Client.enqueue``.

    With ``conn``, the job is inserted in the caller's transaction instead.
    """
    global _async_client
    if _async_client is None:
        _async_client = Client()
    return await _async_client.enqueue(
        type,
        payload,
        org_id=org_id,
        queue=queue,
        dedup_key=dedup_key,
        run_after=run_after,
        job_id=job_id,
        priority=priority,
        concurrency_key=concurrency_key,
        depends_on=depends_on,
        conn=conn,
    )


def enqueue_sync(
    type: str,
    payload: dict[str, Any] | None = None,
    *,
    org_id: str,
    queue: str = "default",
    dedup_key: str | None = None,
    run_after: datetime | None = None,
    job_id: uuid.UUID | str | None = None,
    priority: int = 0,
    concurrency_key: str | None = None,
    depends_on: Iterable[uuid.UUID | str] = (),
    conn: psycopg.Connection[Any] | None = None,
) -> Job:
    """Enqueue a job from synchronous code; see ``SyncClient.enqueue``."""
    global _sync_client
    if _sync_client is None:
        _sync_client = SyncClient()
    return _sync_client.enqueue(
        type,
        payload,
        org_id=org_id,
        queue=queue,
        dedup_key=dedup_key,
        run_after=run_after,
        job_id=job_id,
        priority=priority,
        concurrency_key=concurrency_key,
        depends_on=depends_on,
        conn=conn,
    )
