"""Register this daemon in ``jobsd.workers``, hold its lock and renew its lease for as
long as it lives: the daemon's liveness, apart from any job's progress.

The lock is a session advisory lock on ``jobsd.worker_lock_key(worker_id)``, held on a
dedicated connection (a twin of the LISTEN connection, which keeps its own
semantics). It is taken before the row is inserted. The lease is the row's
``alive_until``, renewed on that connection every ``interval_s`` (jittered) for
``lease_s``. A sweeper declares the daemon dead only when it can take the lock and the
lease has run out: the process died, or its connection did and it could not take its
lock again within its lease. When the connection is lost the lifeline reconnects, takes
the lock again and registers again; each renewal that gets through is reported to the
fence (``fence.py``), which stops every run before a lease that could not be renewed
ends. A clean stop deletes the row.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from jobsd.errors import BackendUnavailable, DatabaseError
from jobsd.registry import Registry
from jobsd.store import workers
from jobsd.store.db import AsyncConn
from jobsd.worker.clock import Clock
from jobsd.worker.loop import pause, run_loop

__all__ = ["Lifeline", "LifelineSettings"]

log = logging.getLogger(__name__)

# how long to wait for our own lock, which a sweeper holds while it rescues our old jobs
_LOCK_WAIT_S = 30.0


@dataclass(frozen=True, slots=True)
class LifelineSettings:
    """What the lifeline needs: who we are, and how often to check the connection."""

    worker_id: str
    interval_s: float
    """how often the lease is renewed: ``JOBSD_DEATH_CHECK_INTERVAL``, at most a sixth
    of the lease"""
    lease_s: float
    """``JOBSD_WORKER_LEASE``"""
    hostname: str
    pid: int
    known_types_only: bool = False
    """the row says the daemon claims only its registry's types (else: every type)"""


@dataclass(eq=False, repr=False)
class Lifeline:
    """Hold the worker's registration and lock on a dedicated connection."""

    connect: Callable[[], Awaitable[AsyncConn]]
    cfg: LifelineSettings
    clock: Clock
    registry: Registry | None = None
    on_renewed: Callable[[float], None] | None = None
    """told the monotonic time a renewal (or registration) that got through was sent"""
    registered: bool = field(default=False, init=False)
    registrations: int = field(default=0, init=False)
    _conn: AsyncConn | None = field(default=None, init=False)
    _session_pid: int | None = field(default=None, init=False)
    """the server pid of the session that holds our lock (the last one that took it)"""

    async def run_once(self) -> bool:
        """Register when not registered (connect, lock, insert the row); else renew the
        lease. Return True when this pass registered.

        A lost connection is dropped, with the registration, and BackendUnavailable
        raised: the next pass reconnects.
        """
        try:
            if self._conn is None:
                self._conn = await self.connect()
            if not self.registered:
                await self._register(self._conn)
                return True
            sent_at = self.clock.monotonic()
            if not await workers.renew_worker(
                self._conn, self.cfg.worker_id, lease_s=self.cfg.lease_s
            ):
                # our row was deleted while we held the lock: only by hand; put it back
                await self._insert_row(self._conn)
            self._renewed(sent_at)
            return False
        except BackendUnavailable as exc:
            log.warning("worker.connection_lost", extra={"error": str(exc)})
            await self._drop()
            raise

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Register and hold the lock until cancelled; report started once registered.

        On the way out the row is deleted (for at most 5 s) and the connection closed.
        """
        await run_loop(
            "worker registration",
            self.run_once,
            pause(self.cfg.interval_s, self.clock),
            self.clock,
            task_status=task_status,
            started_after_first_pass=True,
            aclose=self.aclose,
        )

    async def aclose(self) -> None:
        """Deregister (best effort) and close the connection, which frees the lock."""
        conn = self._conn
        if conn is None:
            return
        if self.registered:
            try:
                with anyio.move_on_after(5):
                    await workers.deregister_worker(conn, self.cfg.worker_id)
                    log.info("worker.deregistered", extra={"worker_id": self.cfg.worker_id})
            except (BackendUnavailable, DatabaseError) as exc:
                log.warning("worker.deregister_failed", extra={"error": str(exc)})
        await self._drop()

    async def _register(self, conn: AsyncConn) -> None:
        # the lock first: a row that is visible always has its lock held
        ended = False
        with anyio.move_on_after(_LOCK_WAIT_S) as waiting:
            while (pid := await workers.lock_worker(conn, self.cfg.worker_id)) is None:
                if self._session_pid is not None and not ended:
                    # our earlier session may still hold it: a cut the server has not
                    # noticed; it is ours, end it
                    ended = await workers.end_session(conn, self._session_pid)
                    if ended:
                        log.warning(
                            "worker.earlier_session_ended", extra={"pid": self._session_pid}
                        )
                # else a sweeper holds it for a moment while it rescues our old jobs
                await self.clock.sleep(0.1)
            self._session_pid = pid
            sent_at = self.clock.monotonic()
            await self._insert_row(conn)
        if waiting.cancelled_caught:
            # not a reason to end the daemon: try again on a new connection
            raise BackendUnavailable(
                f"the lock of worker {self.cfg.worker_id!r} stayed taken for {_LOCK_WAIT_S:g} s"
            )
        self._renewed(sent_at)
        self.registered = True
        self.registrations += 1
        log.info("worker.registered", extra={"worker_id": self.cfg.worker_id})

    async def _insert_row(self, conn: AsyncConn) -> None:
        registry = self.registry
        rules = []
        if registry is not None:
            rules = [
                workers.TypeRule(t, spec.delivery, spec.max_attempts)
                for t in registry.types()
                if (spec := registry.get(t)) is not None
            ]
        types = [r.type for r in rules] if self.cfg.known_types_only else None
        await workers.register_worker(
            conn,
            self.cfg.worker_id,
            hostname=self.cfg.hostname,
            pid=self.cfg.pid,
            lease_s=self.cfg.lease_s,
            types=types,
            rules=rules,
        )

    def _renewed(self, sent_at: float) -> None:
        if self.on_renewed is not None:
            self.on_renewed(sent_at)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self.registered = False
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.close()
