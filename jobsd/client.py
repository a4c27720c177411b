"""Enqueue jobs and read them back: on jobsd's own pool or in the caller's transaction.

The enqueue is ``jobsd.store.enqueue``'s (the enqueue plan and the dropped-connection
retry); every operation on existing jobs is ``jobsd.ops``'s, as for the CLI, the HTTP
API and the dashboard. A client holds the database's URL: it is an operator, unless a
call names an ``org_id`` (then it acts for that org only). This module is the public
face: ``Client`` (async) and ``SyncClient``, their pools (opened through
``store.connect``: the TLS policy applies), and the queue administration of
``jobsd.admin.queues`` on the client's pool.
"""

from __future__ import annotations

import asyncio
import atexit
import builtins
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Self, TypeVar, Unpack

from pydantic import BaseModel

from jobsd.admin.queues import (
    QueueLimits,
    create_queue,
    drop_queue,
    list_queues,
    set_queue_limits,
)
from jobsd.errors import ConfigError, JobsdError
from jobsd.jobspec import BatchSpec, EnqueueOptions, JobSpec
from jobsd.models import Job, JobEvent, QueueInfo
from jobsd.ops import Caller, cancel, get, listing, queues, resolve, retry, wait
from jobsd.ops import bulk as bulk_ops
from jobsd.ops.bulk import BulkOptions, BulkOutcome
from jobsd.ops.cancel import CancelOutcome
from jobsd.ops.listing import Cursor, JobPage, ListOptions
from jobsd.ops.resolve import Resolution
from jobsd.settings import Settings
from jobsd.store import enqueue as store_enqueue
from jobsd.store.connect import make_async_pool, make_sync_pool
from jobsd.store.db import AsyncConn, AsyncPool, SyncConn, SyncPool, acquire, acquire_sync
from jobsd.store.enqueue_batch import enqueue_batch

__all__ = [
    "CancelOutcome",
    "Client",
    "Cursor",
    "EnqueueOptions",
    "JobPage",
    "JobSpec",
    "ListOptions",
    "Resolution",
    "SyncClient",
]

# who the history names for the operations of a client, unless told otherwise
_ACTOR = "client"

T = TypeVar("T")
P = TypeVar("P")

# connections of the client's pool; a pool timeout of 2 s answers "unavailable" fast
_POOL_TIMEOUT_S = 2.0


_exiting = False


def _not_a_cancellation(record: logging.LogRecord) -> bool:
    """Drop psycopg_pool's warnings about what an exit does on purpose.

    At a loop's end every task is cancelled, a connection in flight included ("error
    connecting in 'client': ", with an empty message); at interpreter exit a pool
    thread blocked in a connection to an unreachable server is left behind ("couldn't
    stop thread"). Neither is a failure worth printing as the program ends.
    """
    args = record.args if isinstance(record.args, tuple) else ()
    if any(isinstance(a, asyncio.CancelledError) for a in args):
        return False
    return not (_exiting and str(record.msg).startswith(("couldn't stop thread", "hint:")))


logging.getLogger("psycopg.pool").addFilter(_not_a_cancellation)


def _database_url(database_url: str | None, settings: Settings) -> str:
    """Return ``database_url``, else JOBSD_DATABASE_URL; ConfigError without either."""
    url = database_url or settings.database_url
    if not url:
        raise ConfigError("no database configured: set JOBSD_DATABASE_URL")
    return url


def _own_pool(make: Callable[..., P], database_url: str | None, settings: Settings) -> P:
    """Create (unopened) a client's pool on ``database_url``, else JOBSD_DATABASE_URL."""
    return make(
        _database_url(database_url, settings),
        name="client",
        min_size=1,
        max_size=settings.pool_size,
        timeout_s=_POOL_TIMEOUT_S,
    )


def _enqueue_org(org_id: str | None, settings: Settings) -> str:
    """Return the org of an enqueue: ``org_id`` when given, else JOBSD_DEFAULT_ORG."""
    if org_id is not None:
        return org_id
    if settings.default_org:
        return settings.default_org
    raise ConfigError("no org_id given and JOBSD_DEFAULT_ORG is not set: give org_id or set it")


def _caller(org_id: str | None, actor: str) -> Caller:
    """Return who a client's call acts as: an operator, or ``org_id``'s caller."""
    return Caller.of_org_or_operator(org_id, actor)


class Client:
    """Enqueue and read jobs through jobsd's own async pool.

    Use as ``async with Client(url) as client``; the pool opens lazily on first use too.
    The URL must pass the TLS policy (``JOBSD_ALLOW_INSECURE`` for plaintext TCP).

    The pool belongs to the event loop that opened it. A client left open is closed
    when that loop ends (``asyncio.run`` returning): a task of the client's waits for
    the loop's final cancellation and closes the pool then, which also stops any pool
    worker caught in the middle of a connection (psycopg_pool's workers survive one
    cancellation and would keep ``asyncio.run`` from returning). After ``close()`` the
    client may be used again: it opens a new pool.
    """

    def __init__(
        self, database_url: str | None = None, *, settings: Settings | None = None
    ) -> None:
        self.settings = settings or Settings()
        self._url = database_url
        self._pool: AsyncPool = _own_pool(make_async_pool, database_url, self.settings)
        self._opened = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """Say whether the pool is closed (a closed client opens a new one when used)."""
        return not self._opened

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        if self._opened:
            if loop is not self._loop:
                raise JobsdError(
                    "this jobsd Client was opened in another event loop: use one client per "
                    "loop (jobsd.enqueue keeps one per loop), or close it first"
                )
            return
        await self._pool.open()
        self._opened = True
        self._loop = loop
        self._closer = loop.create_task(self._close_at_loop_end(), name="jobsd-client-closer")

    async def _close_at_loop_end(self) -> None:
        """Wait until cancelled; cancelled by the loop's end (not by ``close``), close."""
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            if self._closer is asyncio.current_task():
                self._closer = None
                await self._close_pool()
            raise

    async def close(self) -> None:
        """Close the pool (idempotent). The client may be used again: it opens a new one."""
        closer, self._closer = self._closer, None
        if closer is not None and closer is not asyncio.current_task():
            closer.cancel()
        await self._close_pool()

    async def _close_pool(self) -> None:
        if self._opened:
            self._opened = False
            pool, self._pool = self._pool, _own_pool(make_async_pool, self._url, self.settings)
            await pool.close()

    async def _run(self, operation: str, work: Callable[[AsyncConn], Awaitable[T]]) -> T:
        """Run ``work(conn)`` on a pooled connection."""
        await self._open()
        async with acquire(self._pool, operation) as conn:
            return await work(conn)

    async def enqueue(
        self,
        type: str,
        payload: dict[str, Any] | BaseModel | None = None,
        *,
        org_id: str | None = None,
        conn: AsyncConn | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Job:
        """Create a job and return it, or return the existing job on a dedup or id hit.

        ``payload`` is a dict or a pydantic model (stored as its JSON-mode dump);
        ``datetime``, ``UUID`` and ``Decimal`` values are written as pydantic writes
        them (docs/tasks.md). ``org_id`` defaults to ``JOBSD_DEFAULT_ORG`` (ConfigError
        when neither is given).
        ``options`` are ``jobsd.EnqueueOptions``: ``queue``, ``dedup_key``,
        ``run_after``, ``job_id``, ``priority`` (lower runs first, FIFO within a
        priority), ``concurrency_key`` (jobs sharing it run at most their limit at
        once: 1 unless the type or the queue says otherwise), ``depends_on`` (job ids
        that must all succeed first: the job is ``blocked`` until then, and fails if
        one fails). With ``conn``, the insert joins the caller's transaction and
        nothing is committed here. Raises UnknownQueue, QueueFull (nothing was
        inserted), UnknownDependency, InvalidPayload, ValueError (bad arguments),
        BackendUnavailable (no job was created) or OutcomeUnknown (retry with the
        same job id).
        """
        spec = JobSpec.build(
            type,
            payload,
            org_id=_enqueue_org(org_id, self.settings),
            max_payload_bytes=self.settings.max_payload_bytes,
            **options,
        )
        if conn is not None:
            return await store_enqueue.enqueue(conn, spec)
        await self._open()
        return await store_enqueue.enqueue_on_pool(self._pool, spec)

    async def enqueue_many(self, specs: Sequence[JobSpec]) -> list[Job]:
        """Create many jobs at once; return them in order (existing ones on hits).

        All or nothing: one transaction, so an error leaves none of the jobs behind.
        Sending the same specs again (after an ambiguous failure) returns the same jobs.
        A plain batch is one ``INSERT``, or ``COPY`` from 500 jobs (docs/enqueue.md).
        """
        if not specs:
            return []
        await self._open()
        return await store_enqueue.enqueue_many(self._pool, specs)

    async def enqueue_batch(
        self,
        type: str,
        payloads: Iterable[dict[str, Any] | BaseModel | None],
        *,
        org_id: str | None = None,
        queue: str = "default",
        priority: int = 0,
        run_after: datetime | None = None,
    ) -> builtins.list[uuid.UUID]:
        """Create one job of ``type`` per payload; return their ids, in order.

        The fast way in for many jobs of one type, org, queue and priority: no object
        is built per job, the payloads are checked as ``enqueue`` checks them (an error
        names the payload's position: ``payload 3 contains a NUL character ...``), and
        the batch goes in whole or not at all, through ``COPY`` from 64 jobs. For dedup
        keys, job ids, concurrency keys or dependencies, use ``enqueue_many``. Raises
        UnknownQueue, QueueFull, InvalidPayload, PayloadTooLarge, ValueError (none of
        the jobs was created) or BackendUnavailable. The ids are made here: a batch
        whose answer was lost with its connection may be in; where a batch must be
        sent again safely, ``enqueue_many`` with job ids makes that a no-op.
        """
        batch = BatchSpec.build(
            type,
            payloads,
            org_id=_enqueue_org(org_id, self.settings),
            queue=queue,
            priority=priority,
            run_after=run_after,
            max_payload_bytes=self.settings.max_payload_bytes,
        )
        await self._open()
        return await enqueue_batch(self._pool, batch)

    async def get(self, job_id: uuid.UUID | str, *, org_id: str | None = None) -> Job:
        """Read a job (with ``retried_as`` once retried); with ``org_id``, a job of
        another org is reported as not found (JobNotFound)."""
        key = uuid.UUID(str(job_id))
        view = await self._run(
            f"read of job {key}", lambda conn: get.get_job(conn, _caller(org_id, _ACTOR), key)
        )
        return view.job

    async def events(
        self, job_id: uuid.UUID | str, *, org_id: str | None = None
    ) -> builtins.list[JobEvent]:
        """Read the history of a job, oldest first (JobNotFound: no such job)."""
        key = uuid.UUID(str(job_id))
        view = await self._run(
            f"read of history of job {key}",
            lambda conn: get.get_job(conn, _caller(org_id, _ACTOR), key),
        )
        return view.history

    # Operations on existing jobs: the same as the CLI's, the HTTP API's and the
    # dashboard's (jobsd.ops). ``org_id`` limits each to one org's jobs.

    async def cancel(
        self,
        job_id: uuid.UUID | str,
        *,
        reason: str = "cancelled by client",
        org_id: str | None = None,
        actor: str = _ACTOR,
    ) -> CancelOutcome:
        """Cancel a job that has not started, or ask the owner of a running one to cancel it.

        ``action`` is ``cancelled`` or ``requested`` (running: its handler stops at
        once); ``changed`` is False when an earlier cancel did it. Idempotent. Raises
        JobNotFound, and CancelRefused for a job that finished or awaits recovery.
        """
        key = uuid.UUID(str(job_id))
        caller = _caller(org_id, actor)
        return await self._run(
            f"cancel of job {key}",
            lambda conn: cancel.cancel_job(conn, caller, key, reason=reason),
        )

    async def wait(
        self,
        job_id: uuid.UUID | str,
        *,
        timeout_s: float | None = None,
        org_id: str | None = None,
    ) -> Job:
        """Wait until the job ends (succeeded, failed or cancelled) and return it.

        Woken by the database's notification of the end (``LISTEN jobsd_done`` on a
        connection of its own for the wait), never by polling. After ``timeout_s``
        (None: no limit) the job is returned as it is: check ``job.status.terminal``.
        Raises JobNotFound, BackendUnavailable.
        """
        key = uuid.UUID(str(job_id))
        url = _database_url(self._url, self.settings)
        return await wait.wait_job(url, _caller(org_id, _ACTOR), key, timeout_s=timeout_s)

    async def list(self, **options: Unpack[ListOptions]) -> JobPage:
        """List jobs newest first (``limit`` at most, 1..1000), filtered; pass the
        page's ``next`` as ``after`` for the next page (None: it was the last).

        ``options`` are ``jobsd.client.ListOptions``: ``status``, ``type``, ``queue``,
        ``org_id``, ``since`` (aware: jobs created at or after it), ``after``,
        ``limit`` (50). Raises ValueError for a bad filter.
        """
        caller = _caller(options.get("org_id"), _ACTOR)
        return await self._run(
            "listing of jobs", lambda conn: listing.list_jobs(conn, caller, **options)
        )

    async def retry(
        self,
        job_id: uuid.UUID | str,
        *,
        force: bool = False,
        org_id: str | None = None,
        actor: str = _ACTOR,
    ) -> Job:
        """Retry a failed or cancelled job; return the new job, queued (``retry_of`` names
        the retried job, which stays as it ended).

        The new job is admitted like any enqueue: QueueFull or OrgQuotaExceeded, and
        nothing is written. A job is retried once: asking again returns the same new
        job. Refused (RetryRefused, nothing changed) for a job that has not ended, for
        an ``at_most_once`` type unless ``force``, and while a job it depends on has
        not succeeded. Raises JobNotFound.
        """
        key = uuid.UUID(str(job_id))
        caller = _caller(org_id, actor)
        retried = await self._run(
            f"retry of job {key}", lambda conn: retry.retry_job(conn, caller, key, force=force)
        )
        return retried.job

    async def resolve(
        self,
        job_id: uuid.UUID | str,
        how: Resolution | str,
        *,
        org_id: str | None = None,
        actor: str = _ACTOR,
    ) -> Job:
        """Settle a ``recovery_required`` job: ``succeeded``, ``failed`` or ``requeue``;
        return it as written. Raises JobNotFound and ResolveRefused (not awaiting
        recovery: nothing changed)."""
        key = uuid.UUID(str(job_id))
        caller = _caller(org_id, actor)
        return await self._run(
            f"resolve of job {key}", lambda conn: resolve.resolve_job(conn, caller, key, how)
        )

    # Queue administration: see jobsd.admin.queues (and docs/queues.md) for the semantics.

    async def create_queue(self, name: str, **limits: Unpack[QueueLimits]) -> QueueInfo:
        """Declare a queue (limits: ``capacity``, ``concurrency_limit``, ``retention_days``).

        Raises QueueExists if the name is taken.
        """
        return await self._run(
            f"creation of queue {name!r}", lambda conn: create_queue(conn, name, **limits)
        )

    async def set_queue_limits(self, name: str, **changes: Unpack[QueueLimits]) -> QueueInfo:
        """Change the limits given (None removes one); see ``admin.queues.set_queue_limits``."""
        return await self._run(
            f"change of the limits of queue {name!r}",
            lambda conn: set_queue_limits(conn, name, **changes),
        )

    async def list_queues(self) -> builtins.list[QueueInfo]:
        """Return every declared queue with its open jobs by state (every org's)."""
        return await self._run("listing of the queues", list_queues)

    async def pause_queue(self, name: str) -> QueueInfo:
        """Stop claims from a queue (running jobs finish); idempotent."""
        caller = _caller(None, _ACTOR)
        return await self._run(
            f"pause of queue {name!r}", lambda conn: queues.pause_queue(conn, caller, name)
        )

    async def resume_queue(self, name: str) -> QueueInfo:
        """Let daemons claim from a queue again, and wake them; idempotent."""
        caller = _caller(None, _ACTOR)
        return await self._run(
            f"resume of queue {name!r}", lambda conn: queues.resume_queue(conn, caller, name)
        )

    async def drop_queue(self, name: str) -> int:
        """Delete a queue without open jobs, and its finished jobs; return how many jobs.

        Raises QueueNotEmpty (nothing deleted), UnknownQueue, ValueError for ``default``.
        """
        return await self._run(f"drop of queue {name!r}", lambda conn: drop_queue(conn, name))

    # Bulk actions: every job of a filter in one call (jobsd.ops.bulk, as `jobsd jobs
    # retry|cancel|resolve` and POST /jobs/retry|cancel|resolve). ``options`` filter as
    # ``list`` does (status, type, queue, org_id, since, until; ``org_id`` limits the
    # call to that org's jobs), plus ``limit`` (1..10000; 1000) and ``dry_run``.

    async def retry_many(
        self, *, force: bool = False, actor: str = _ACTOR, **options: Unpack[BulkOptions]
    ) -> BulkOutcome:
        """Retry the failed (or ``status="cancelled"``) jobs of the filter that have no
        retry yet, oldest first, at most ``limit``, each as a new job admitted like an
        enqueue; a full queue or an org's quota refuses some (``refused``), the rest go
        on. Again continues with the jobs still matching (``remaining``). ``force``
        retries ``at_most_once`` types too. Raises ValueError for a bad option or an
        unknown queue."""
        caller = _caller(options.get("org_id"), actor)
        return await self._run(
            "bulk retry of jobs",
            lambda conn: bulk_ops.retry_many(conn, caller, force=force, **options),
        )

    async def cancel_many(
        self,
        *,
        reason: str = "cancelled by client (bulk)",
        actor: str = _ACTOR,
        **options: Unpack[BulkOptions],
    ) -> BulkOutcome:
        """Cancel the open jobs of the filter (queued, scheduled, blocked, running; or
        ``status``), oldest first, at most ``limit``: at once, or by a cancel request
        for a running job (``requested``). Raises ValueError for a bad option."""
        caller = _caller(options.get("org_id"), actor)
        return await self._run(
            "bulk cancel of jobs",
            lambda conn: bulk_ops.cancel_many(conn, caller, reason=reason, **options),
        )

    async def resolve_many(
        self, how: Resolution | str, *, actor: str = _ACTOR, **options: Unpack[BulkOptions]
    ) -> BulkOutcome:
        """Settle the ``recovery_required`` jobs of the filter as ``how`` says
        (``succeeded``, ``failed``, ``requeue``), oldest first, at most ``limit``.
        Raises ValueError for a bad ``how`` or option."""
        caller = _caller(options.get("org_id"), actor)
        return await self._run(
            "bulk resolve of jobs",
            lambda conn: bulk_ops.resolve_many(conn, caller, how, **options),
        )


class SyncClient:
    """Enqueue and read jobs from synchronous code (scripts, WSGI apps, threads).

    Use as ``with SyncClient(url) as client``; a client left open is closed at
    interpreter exit (``atexit``), before the pool's threads and the modules go, so
    the exit is quiet. After ``close()`` the client may be used again.
    """

    def __init__(
        self, database_url: str | None = None, *, settings: Settings | None = None
    ) -> None:
        self.settings = settings or Settings()
        self._url = database_url
        self._pool: SyncPool = _own_pool(make_sync_pool, database_url, self.settings)
        self._opened = False
        self._lock = threading.Lock()

    def __enter__(self) -> Self:
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Say whether the pool is closed (a closed client opens a new one when used)."""
        return not self._opened

    def _open(self) -> None:
        if self._opened:
            return
        with self._lock:
            if not self._opened:
                self._pool.open()
                self._opened = True
                _open_sync_pools.add(self._pool)

    def close(self, *, timeout_s: float = 5.0) -> None:
        """Close the pool (idempotent), waiting up to ``timeout_s`` for its threads.

        The client may be used again: it opens a new pool.
        """
        with self._lock:
            if self._opened:
                self._opened = False
                pool, self._pool = self._pool, _own_pool(make_sync_pool, self._url, self.settings)
                _close_sync_pool(pool, timeout_s)

    def enqueue(
        self,
        type: str,
        payload: dict[str, Any] | BaseModel | None = None,
        *,
        org_id: str | None = None,
        conn: SyncConn | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Job:
        """Create a job; see ``Client.enqueue``."""
        spec = JobSpec.build(
            type,
            payload,
            org_id=_enqueue_org(org_id, self.settings),
            max_payload_bytes=self.settings.max_payload_bytes,
            **options,
        )
        if conn is not None:
            return store_enqueue.enqueue_sync(conn, spec)
        self._open()
        return store_enqueue.enqueue_on_pool_sync(self._pool, spec)

    def get(self, job_id: uuid.UUID | str, *, org_id: str | None = None) -> Job:
        """Read a job; see ``Client.get``."""
        key = uuid.UUID(str(job_id))
        view = self._run(
            f"read of job {key}", lambda conn: get.get_job_sync(conn, _caller(org_id, _ACTOR), key)
        )
        return view.job

    def events(
        self, job_id: uuid.UUID | str, *, org_id: str | None = None
    ) -> builtins.list[JobEvent]:
        """Read the history of a job, oldest first; see ``Client.events``."""
        key = uuid.UUID(str(job_id))
        view = self._run(
            f"read of history of job {key}",
            lambda conn: get.get_job_sync(conn, _caller(org_id, _ACTOR), key),
        )
        return view.history

    def _run(self, operation: str, work: Callable[[SyncConn], T]) -> T:
        """Run ``work(conn)`` on a pooled connection."""
        self._open()
        with acquire_sync(self._pool, operation) as conn:
            return work(conn)

    def cancel(
        self,
        job_id: uuid.UUID | str,
        *,
        reason: str = "cancelled by client",
        org_id: str | None = None,
        actor: str = _ACTOR,
    ) -> CancelOutcome:
        """Cancel a job, or request the cancel of a running one; see ``Client.cancel``."""
        key = uuid.UUID(str(job_id))
        caller = _caller(org_id, actor)
        return self._run(
            f"cancel of job {key}",
            lambda conn: cancel.cancel_job_sync(conn, caller, key, reason=reason),
        )

    def wait(
        self,
        job_id: uuid.UUID | str,
        *,
        timeout_s: float | None = None,
        org_id: str | None = None,
    ) -> Job:
        """Wait until the job ends, or ``timeout_s``; see ``Client.wait``."""
        key = uuid.UUID(str(job_id))
        url = _database_url(self._url, self.settings)
        return wait.wait_job_sync(url, _caller(org_id, _ACTOR), key, timeout_s=timeout_s)

    def list(self, **options: Unpack[ListOptions]) -> JobPage:
        """List jobs newest first, filtered, one page; see ``Client.list``."""
        caller = _caller(options.get("org_id"), _ACTOR)
        return self._run(
            "listing of jobs", lambda conn: listing.list_jobs_sync(conn, caller, **options)
        )

    def retry(
        self,
        job_id: uuid.UUID | str,
        *,
        force: bool = False,
        org_id: str | None = None,
        actor: str = _ACTOR,
    ) -> Job:
        """Retry a failed or cancelled job as a new job; see ``Client.retry``."""
        key = uuid.UUID(str(job_id))
        caller = _caller(org_id, actor)
        retried = self._run(
            f"retry of job {key}",
            lambda conn: retry.retry_job_sync(conn, caller, key, force=force),
        )
        return retried.job

    def retry_many(
        self, *, force: bool = False, actor: str = _ACTOR, **options: Unpack[BulkOptions]
    ) -> BulkOutcome:
        """Retry the failed jobs of the filter; see ``Client.retry_many``."""
        caller = _caller(options.get("org_id"), actor)
        return self._run(
            "bulk retry of jobs",
            lambda conn: bulk_ops.retry_many_sync(conn, caller, force=force, **options),
        )

    def cancel_many(
        self,
        *,
        reason: str = "cancelled by client (bulk)",
        actor: str = _ACTOR,
        **options: Unpack[BulkOptions],
    ) -> BulkOutcome:
        """Cancel the open jobs of the filter; see ``Client.cancel_many``."""
        caller = _caller(options.get("org_id"), actor)
        return self._run(
            "bulk cancel of jobs",
            lambda conn: bulk_ops.cancel_many_sync(conn, caller, reason=reason, **options),
        )

    def resolve_many(
        self, how: Resolution | str, *, actor: str = _ACTOR, **options: Unpack[BulkOptions]
    ) -> BulkOutcome:
        """Settle the recovery_required jobs of the filter; see ``Client.resolve_many``."""
        caller = _caller(options.get("org_id"), actor)
        return self._run(
            "bulk resolve of jobs",
            lambda conn: bulk_ops.resolve_many_sync(conn, caller, how, **options),
        )


# The open pools of sync clients, held here: a client dropped without close() keeps
# its pool (idle connections) until exit, when one atexit hook closes it while the
# pool's threads and the modules they use are still there. Without this, the garbage
# collector may finalize the pool in one of its own threads, which fails noisily
# ("cannot join current thread").
_open_sync_pools: set[SyncPool] = set()


def _close_sync_pool(pool: SyncPool, timeout_s: float) -> None:
    _open_sync_pools.discard(pool)
    pool.close(timeout=timeout_s)


@atexit.register
def _close_sync_pools_at_exit() -> None:
    global _exiting
    _exiting = True
    for pool in list(_open_sync_pools):
        # a pool thread stuck connecting to an unreachable server is a daemon thread:
        # do not hold the exit for it
        _close_sync_pool(pool, 0.5)
