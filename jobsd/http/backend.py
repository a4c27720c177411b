"""What the API's routes stand on: a pool, the LISTEN waiter, the loop monitor, rate limits.

One ``ApiBackend`` per app (or per mounted router). Its lifespan opens everything
without waiting for the database, so the API comes up (and says 503) while Postgres
is down. Submissions, reads, cancels and introspection use a pool of the API's own,
so the API never takes connections from an attached daemon. Every query on jobs sets
the org for its transaction first (``store.api.run_for_org``): the API works under the
enqueue or the read role, with row-level security behind its ``WHERE org_id``.

With a read replica (``JOBSD_API_READ_DATABASE_URL``, else ``JOBSD_READ_DATABASE_URL``)
the reads that may lag (``read_lagging``: the dashboard's pages, listings, a job read
without ``wait``) use a second pool on it, under the same role check and the same org
context per read; the primary answers whenever the replica does not
(``store.replica``). Everything else stays on the primary (docs/replicas.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

import anyio

from jobsd.errors import BackendUnavailable, ConfigError, JobNotFound
from jobsd.http.loadlimits import ConcurrencyCap, ProbeCache
from jobsd.http.monitor import LoopMonitor
from jobsd.http.problems import problem
from jobsd.http.protocols import DaemonView
from jobsd.http.ratelimit import SubmitLimiter
from jobsd.http.settings import HttpSettings
from jobsd.http.waiter import DoneWaiter
from jobsd.jobspec import JobSpec
from jobsd.models import Job
from jobsd.settings import Settings
from jobsd.store.api import role_bypass
from jobsd.store.connect import make_async_pool
from jobsd.store.db import AsyncConn, AsyncPool, acquire
from jobsd.store.enqueue import enqueue_on_pool
from jobsd.store.replica import Lagged, ReplicaGate, try_replica
from jobsd.store.tls import allow_insecure

__all__ = ["ApiBackend", "Lagged"]

log = logging.getLogger(__name__)

# the longest a read waits for a connection of the replica before the primary answers
# it (after which the replica's gate stays closed for store.replica.RETRY_AFTER_S)
_REPLICA_WAIT_S = 1.0

P = ParamSpec("P")
T = TypeVar("T")


class ApiBackend:
    """The API's connections and background tasks, opened by ``lifespan``."""

    def __init__(
        self,
        settings: Settings | None = None,
        http: HttpSettings | None = None,
        *,
        daemon: DaemonView | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.http = http or HttpSettings()
        self.daemon = daemon
        self.monitor = LoopMonitor()
        self.started_monotonic = time.monotonic()
        rate = self.http.submit_rate_limit()
        self.submit_limiter: SubmitLimiter | None = SubmitLimiter(rate) if rate else None
        reads = self.http.read_rate_limit()
        self.read_limiter: SubmitLimiter | None = SubmitLimiter(reads) if reads else None
        self.longpolls = ConcurrencyCap(
            self.http.longpoll_max_concurrent, self.http.longpoll_max_per_token
        )
        self.probes = ProbeCache(self.http.probe_cache_s)
        self.grants = ProbeCache(self.http.token_cache_s)
        # long-polls read through at most half the pool: however many wait, the other
        # half stays free for submissions (a long-poll may wait its turn: it has time)
        self.longpoll_reads = anyio.Semaphore(max(1, self.settings.pool_size // 2))
        self._pool: AsyncPool | None = None
        self._probe_pool: AsyncPool | None = None
        self._replica_pool: AsyncPool | None = None
        self._replica_role_checked = False
        self.replica_gate = ReplicaGate()
        """Whether the reads that may lag try the replica now (closed after a failure)."""
        self._waiter: DoneWaiter | None = None
        self._ready: anyio.Event | None = None
        self._role_checked = False
        self._refused: str | None = None
        self.startup_error: BaseException | None = None
        """Why the lifespan failed to start (``serve`` raises it again)."""

    @property
    def body_limit(self) -> int:
        """Return the request body cap in bytes."""
        return self.http.body_limit(self.settings.max_payload_bytes)

    @property
    def pool(self) -> AsyncPool:
        """Return the pool for reads, cancels and introspection."""
        if self._refused is not None:
            raise problem(503, "insecure_role", "the API refuses its database role: see the log")
        if self._pool is None:
            raise _not_started()
        return self._pool

    @property
    def waiter(self) -> DoneWaiter:
        """Return the LISTEN waiter of long-polls."""
        if self._waiter is None:
            raise _not_started()
        return self._waiter

    @property
    def started(self) -> bool:
        """Say whether the lifespan has opened everything."""
        return self._waiter is not None

    async def wait_started(self) -> None:
        """Wait until the lifespan has opened everything."""
        if self._ready is None:
            self._ready = anyio.Event()
        if self.started:
            return
        await self._ready.wait()

    def close_waits(self) -> None:
        """Answer every long-poll now, with the current state: the server is stopping."""
        if self._waiter is not None:
            self._waiter.close()

    async def submit(self, spec: JobSpec) -> Job:
        """Create the job of ``spec`` for its org (or return the one holding its id or key).

        The client's enqueue plan and dropped-connection retry (``store.enqueue``), each
        statement scoped by org: under the enqueue role row-level security accepts the
        insert and shows the re-reads. The API fixes the job id before the first
        attempt, so a retry can never create a second job. Raises UnknownQueue,
        DuplicateJob (the id belongs to another org's job), BackendUnavailable (no job
        was created), OutcomeUnknown (retry with the same id) or DatabaseError.
        """
        return await enqueue_on_pool(self.pool, spec, org_scoped=True)

    def submission_wait(self, key: str) -> int | None:
        """Take one submission from ``key``'s bucket (``JOBSD_SUBMIT_RATE``): None when
        it passes, else the seconds to wait (Retry-After). A job submitted and a retry
        count alike, through the API and the dashboard."""
        limiter = self.submit_limiter
        if limiter is None:
            return None
        wait_s = limiter.take(key)
        return limiter.retry_after_s(wait_s) if wait_s > 0 else None

    def take_submissions(self, key: str, wanted: int) -> tuple[int, int | None]:
        """Take up to ``wanted`` submissions from ``key``'s bucket, one by one as
        ``submission_wait`` does: return how many were taken, and the seconds to wait
        when the bucket ran dry first (None: all were taken). A bulk retry counts as
        that many single retries."""
        for taken in range(wanted):
            wait_s = self.submission_wait(key)
            if wait_s is not None:
                return taken, wait_s
        return wanted, None

    async def read(
        self,
        operation: str,
        fn: Callable[Concatenate[AsyncConn, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run ``fn(conn, ...)`` on a pooled connection; retry once on a dropped connection.

        For idempotent work only: after a database restart the pool may hand out a
        connection that died meanwhile, and one retry takes a fresh one. When no
        connection came at all (the pool timed out: the database is down), the answer
        is given at once rather than after a second wait.
        """
        return await self._run(operation, lambda conn: fn(conn, *args, **kwargs), repeat=True)

    async def read_lagging(
        self, operation: str, work: Callable[[AsyncConn], Awaitable[T]], *, fresh: bool = False
    ) -> Lagged[T]:
        """Run ``work(conn)``, a read that may lag, on the read replica; on the primary
        (``read``) when there is none, it is unavailable (``store.replica.try_replica``),
        or it finds no such job (JobNotFound: perhaps not replayed yet, so the primary
        decides), or with ``fresh`` (a page shown right after its viewer's change).
        Never for a write, nor for a read that decides one."""
        pool = self._replica_pool
        if pool is not None and self._refused is None and not fresh:
            before = None if self._replica_role_checked else self._check_replica_role
            try:
                served = await try_replica(
                    self.replica_gate, lambda: acquire(pool, operation), work, before=before
                )
            except JobNotFound:
                served = None
            if served is not None:
                return served
        return Lagged(await self.read(operation, work), False)

    async def once(self, operation: str, fn: Callable[[AsyncConn], Awaitable[T]]) -> T:
        """Run ``fn(conn)`` on a pooled connection, once: for a change that must not be
        repeated blindly after a dropped connection (create, drop)."""
        return await self._run(operation, fn, repeat=False)

    async def _run(
        self, operation: str, work: Callable[[AsyncConn], Awaitable[T]], *, repeat: bool
    ) -> T:
        connected = False
        try:
            async with acquire(self.pool, operation) as conn:
                connected = True
                return await work(conn)
        except BackendUnavailable:
            if not (repeat and connected):
                raise
            async with acquire(self.pool, operation) as conn:
                return await work(conn)

    async def probe_read(
        self,
        operation: str,
        fn: Callable[Concatenate[AsyncConn, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run ``fn(conn, ...)`` for a probe on the probes' own connection, never the
        tenants' pool: a flood of probes cannot delay a submission (see ``probes``)."""
        pool = self._probe_pool
        if pool is None:
            raise _not_started()
        async with acquire(pool, operation) as conn:
            return await fn(conn, *args, **kwargs)

    @property
    def database_url(self) -> str | None:
        """Return the API's URL: ``JOBSD_API_DATABASE_URL``, else ``JOBSD_DATABASE_URL``."""
        return self.http.api_database_url or self.settings.database_url

    @property
    def read_database_url(self) -> str | None:
        """Return the API's read replica: ``JOBSD_API_READ_DATABASE_URL``, else
        ``JOBSD_READ_DATABASE_URL`` (None: no replica)."""
        return self.http.api_read_database_url or self.settings.read_database_url

    async def _check_role(self, pool: AsyncPool) -> None:
        """Refuse a role that bypasses row-level security, unless JOBSD_ALLOW_INSECURE.

        With the database away the check is left to the first request's connection
        (``_role_checked`` stays False) rather than holding the start.
        """
        try:
            async with acquire(pool, "role check") as conn:
                await self._judge_role(conn)
        except BackendUnavailable:
            log.warning("api.role_check_deferred")
            return
        self._role_checked = True

    async def _check_replica_role(self, conn: AsyncConn) -> None:
        """Check the replica's role on its first connection, as the primary's: a refusal
        closes the API (503), as ``_check_role_later``'s."""
        try:
            await self._judge_role(conn, "JOBSD_API_READ_DATABASE_URL")
        except ConfigError as exc:
            self._refused = str(exc)
            log.error("api.role_refused", extra={"error": str(exc), "server": "read replica"})
            raise problem(
                503, "insecure_role", "the API refuses its database role: see the log"
            ) from None
        self._replica_role_checked = True

    async def _judge_role(self, conn: AsyncConn, setting: str = "JOBSD_API_DATABASE_URL") -> None:
        """Raise ConfigError when the role of ``conn`` bypasses row-level security,
        unless JOBSD_ALLOW_INSECURE (then warn)."""
        role, bypass = await role_bypass(conn)
        if not bypass:
            return
        if allow_insecure():
            log.warning("security.api_role_bypasses_rls", extra={"role": role, "why": bypass})
            return
        raise ConfigError(
            f"refusing to serve the API as database role {role!r}: it bypasses row-level "
            f"security ({bypass}); set {setting} to the API's role "
            "(`jobsd roles create` makes <prefix>_api), or JOBSD_ALLOW_INSECURE=1 for a "
            "development setup"
        )

    async def _check_replica_role_now(self, pool: AsyncPool) -> None:
        """Check the replica's role at start (ConfigError); with the replica away, its
        first read checks it (``read_lagging``)."""
        try:
            async with acquire(pool, "role check of the read replica") as conn:
                await self._judge_role(conn, "JOBSD_API_READ_DATABASE_URL")
        except BackendUnavailable:
            log.warning("api.role_check_deferred", extra={"server": "read replica"})
            return
        self._replica_role_checked = True

    async def _check_role_later(self, pool: AsyncPool) -> None:
        """Check the role once the database is back; a refusal closes the API (503)."""
        while not self._role_checked:
            await anyio.sleep(1.0)
            try:
                await self._check_role(pool)
            except ConfigError as exc:
                self._refused = str(exc)
                log.error("api.role_refused", extra={"error": str(exc)})
                return

    @asynccontextmanager
    async def lifespan(self, app: Any = None) -> AsyncIterator[None]:
        """Open the pool and the waiter; close them on exit."""
        url = self.database_url
        if not url:
            raise ConfigError("no database configured: set JOBSD_DATABASE_URL")
        pool = make_async_pool(
            url,
            name="api",
            min_size=1,
            max_size=self.settings.pool_size,
            timeout_s=self.http.ready_timeout,
        )
        probe_pool = make_async_pool(
            url, name="probe", min_size=1, max_size=2, timeout_s=self.http.ready_timeout
        )
        waiter = DoneWaiter(url)
        read_url = self.read_database_url
        replica_pool = None
        if read_url:
            replica_pool = make_async_pool(
                read_url,
                name="api-read",
                min_size=1,
                max_size=self.settings.pool_size,
                timeout_s=min(self.http.ready_timeout, _REPLICA_WAIT_S),
                writable=False,
            )
        await pool.open(wait=False)
        await probe_pool.open(wait=False)
        if replica_pool is not None:
            await replica_pool.open(wait=False)
        self._probe_pool = probe_pool
        try:
            await self._check_role(pool)
            if replica_pool is not None:
                await self._check_replica_role_now(replica_pool)
        except BaseException as exc:
            self.startup_error = exc
            with anyio.CancelScope(shield=True):
                await pool.close()
                if replica_pool is not None:
                    await replica_pool.close()
            raise
        try:
            async with anyio.create_task_group() as tg:
                if not self._role_checked:
                    tg.start_soon(self._check_role_later, pool)
                await tg.start(waiter.run)
                await tg.start(self.monitor.run)
                self._pool, self._waiter = pool, waiter
                self._replica_pool = replica_pool
                if self._ready is None:
                    self._ready = anyio.Event()
                self._ready.set()
                log.info("api.started")
                try:
                    yield
                finally:
                    waiter.close()
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await pool.close()
                await probe_pool.close()
                if replica_pool is not None:
                    await replica_pool.close()
            self._pool = self._waiter = self._probe_pool = self._replica_pool = None
            log.info("api.stopped")


def _not_started() -> Exception:
    return problem(
        503,
        "not_started",
        "the jobsd API has not started: include its router in an app whose lifespan runs",
    )
