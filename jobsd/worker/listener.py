"""LISTEN on a dedicated connection and wake the claimer when work arrives.

The NOTIFY payload is a queue name; a daemon that serves some queues only ignores the
others. After every (re)connection the claimer is woken too: notifications sent while
the connection was down are lost, and an immediate poll makes up for them.
"""

from __future__ import annotations

import logging
import time

import anyio
import psycopg
from anyio.abc import TaskStatus

from jobsd.errors import BackendUnavailable
from jobsd.store.db import db_errors, transient_retries
from jobsd.worker.stats import DaemonStats
from jobsd.worker.waker import Waker

__all__ = ["CHANNEL", "Listener"]

log = logging.getLogger(__name__)

CHANNEL = "jobsd"


class Listener:
    """Hold the LISTEN connection and turn notifications into wake-ups."""

    def __init__(self, url: str, queues: list[str], waker: Waker, stats: DaemonStats) -> None:
        self.url = url
        self.queues = frozenset(queues)
        self.waker = waker
        self.stats = stats
        self.connected = False

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen forever, reconnecting with back-off; report started once first connected."""
        started = False
        first = True
        while True:
            conn: psycopg.AsyncConnection[object] | None = None
            async for attempt in transient_retries("listen"):
                with attempt, db_errors("listen connection"):
                    conn = await psycopg.AsyncConnection.connect(
                        self.url,
                        autocommit=True,
                        application_name="jobsd-listen",
                        keepalives=1,
                        keepalives_idle=30,
                        keepalives_interval=10,
                        keepalives_count=3,
                    )
            assert conn is not None
            try:
                async with conn:
                    with db_errors("listen"):
                        await conn.execute(f"LISTEN {CHANNEL}")
                    self.connected = True
                    if not first:
                        self.stats.reconnects += 1
                        log.info("listener.reconnected")
                    first = False
                    self.waker.wake("reconnect")
                    if not started:
                        started = True
                        task_status.started()
                    await self._receive(conn)
            except BackendUnavailable as exc:
                log.warning("listener.lost", extra={"error": str(exc)})
            finally:
                self.connected = False

    async def _receive(self, conn: psycopg.AsyncConnection[object]) -> None:
        with db_errors("listen"):
            async for note in conn.notifies():
                if not self.queues or note.payload in self.queues:
                    self.stats.last_notify_monotonic = time.monotonic()
                    self.waker.wake("notify")
