"""Register this daemon in ``jobsd.workers`` and hold its lock for as long as it lives.

The lock is a session advisory lock on ``jobsd.worker_lock_key(worker_id)``, held on a
dedicated connection (a twin of the LISTEN connection, which keeps its own
semantics). It is taken before the row is inserted, so any sweeper that sees the row
and can take the lock knows the session is gone: the process died, or its
connection did. The connection is checked every ``death_check_interval``; when it
is lost the lock goes with it, and the lifeline reconnects, takes the lock again and
registers again. Meanwhile a sweeper may have rescued this daemon's jobs: fencing
(the lease) then discards what the old runs report. A clean stop deletes the row.
"""

from __future__ import annotations

import logging
import os
import socket

import anyio
import psycopg
from anyio.abc import TaskStatus

from jobsd.errors import BackendUnavailable, DatabaseError
from jobsd.store.db import db_errors, transient_retries
from jobsd.store.queries import run_named

__all__ = ["Lifeline"]

log = logging.getLogger(__name__)


class Lifeline:
    """Hold the worker's registration and lock on a dedicated connection."""

    def __init__(self, url: str, worker_id: str, interval_s: float) -> None:
        self.url = url
        self.worker_id = worker_id
        self.interval_s = interval_s
        self.registered = False
        self.registrations = 0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Register and hold the lock until cancelled; report started once registered."""
        started = False
        while True:
            conn: psycopg.AsyncConnection[object] | None = None
            async for attempt in transient_retries("worker registration"):
                with attempt, db_errors("worker connection"):
                    conn = await psycopg.AsyncConnection.connect(
                        self.url,
                        autocommit=True,
                        application_name="jobsd-lifeline",
                        keepalives=1,
                        keepalives_idle=30,
                        keepalives_interval=10,
                        keepalives_count=3,
                    )
            assert conn is not None
            try:
                async with conn:
                    await self._register(conn)
                    if not started:
                        started = True
                        task_status.started()
                    try:
                        await self._hold(conn)
                    finally:
                        with anyio.CancelScope(shield=True):
                            await self._deregister(conn)
            except BackendUnavailable as exc:
                log.warning("worker.connection_lost", extra={"error": str(exc)})
                await anyio.sleep(0.05)
            finally:
                self.registered = False

    async def _register(self, conn: psycopg.AsyncConnection[object]) -> None:
        # the lock first: a row that is visible always has its lock held
        with anyio.fail_after(30), db_errors(f"lock of worker {self.worker_id!r}"):
            while True:
                rows = await run_named(conn, "workers_lock", {"worker_id": self.worker_id})
                if rows[0]["locked"]:
                    break
                # a sweeper holds it for a moment while it rescues our old jobs
                await anyio.sleep(0.1)
            await run_named(
                conn,
                "workers_register",
                {"worker_id": self.worker_id, "hostname": socket.gethostname(), "pid": os.getpid()},
            )
        self.registered = True
        self.registrations += 1
        log.info("worker.registered", extra={"worker_id": self.worker_id})

    async def _hold(self, conn: psycopg.AsyncConnection[object]) -> None:
        while True:
            await anyio.sleep(self.interval_s)
            with db_errors(f"touch of worker {self.worker_id!r}"):
                rows = await run_named(conn, "workers_touch", {"worker_id": self.worker_id})
            if not rows:
                # our row was deleted while we held the lock: only by hand; put it back
                await run_named(
                    conn,
                    "workers_register",
                    {
                        "worker_id": self.worker_id,
                        "hostname": socket.gethostname(),
                        "pid": os.getpid(),
                    },
                )

    async def _deregister(self, conn: psycopg.AsyncConnection[object]) -> None:
        try:
            with anyio.move_on_after(5), db_errors(f"deregistration of {self.worker_id!r}"):
                await run_named(conn, "workers_deregister", {"worker_id": self.worker_id})
                log.info("worker.deregistered", extra={"worker_id": self.worker_id})
        except (BackendUnavailable, DatabaseError) as exc:
            log.warning("worker.deregister_failed", extra={"error": str(exc)})
