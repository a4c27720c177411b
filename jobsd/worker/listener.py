"""LISTEN on a dedicated connection: wake the claimer when work arrives, and cancel a
running handler when its cancel request commits.

On ``CHANNEL`` the payload is a queue name; a daemon that serves some queues only
ignores the others. After every (re)connection the claimer is woken too: notifications
sent while the connection was down are lost, and an immediate poll makes up for them.
On ``CANCEL_CHANNEL`` the payload is a job id; the daemon that holds the job cancels
its handler (``on_cancel``). One missed while the connection was down is noticed by
the heartbeat.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus

from jobsd.errors import BackendUnavailable
from jobsd.store.db import AsyncConn
from jobsd.store.listen import channel_notifications
from jobsd.worker.clock import Clock
from jobsd.worker.loop import run_loop
from jobsd.worker.stats import DaemonStats
from jobsd.worker.waker import Waker

__all__ = ["CANCEL_CHANNEL", "CHANNEL", "Listener", "ListenerSettings"]

log = logging.getLogger(__name__)

CHANNEL = "jobsd"
CANCEL_CHANNEL = "jobsd_cancel"


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    """The queues whose notifications wake the claimer; empty is every queue."""

    queues: frozenset[str]


@dataclass(eq=False, repr=False)
class Listener:
    """Hold the LISTEN connection and turn notifications into wake-ups.

    ``connect`` opens a connection that already LISTENs on ``CHANNEL`` and
    ``CANCEL_CHANNEL``.
    """

    connect: Callable[[], Awaitable[AsyncConn]]
    cfg: ListenerSettings
    clock: Clock
    waker: Waker
    stats: DaemonStats
    on_cancel: Callable[[uuid.UUID], None] | None = None
    """cancel the handler of this job if this daemon runs it"""
    connected: bool = field(default=False, init=False)
    _conn: AsyncConn | None = field(default=None, init=False)
    _connections: int = field(default=0, init=False)

    async def run_once(self, *, timeout_s: float = 0.0, stop_after: int | None = None) -> int:
        """Connect when not connected (which wakes the claimer), then relay the
        notifications that arrive within ``timeout_s`` (or the first ``stop_after``);
        return how many woke the claimer."""
        if self._conn is None:
            await self._connect()
        return await self._relay(timeout_s, stop_after)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled, reconnecting through outages; report started once
        first connected."""
        await run_loop(
            "listen",
            self._connect_or_relay,
            anyio.lowlevel.checkpoint,
            self.clock,
            task_status=task_status,
            started_after_first_pass=True,
            aclose=self.aclose,
        )

    async def aclose(self) -> None:
        """Close the connection."""
        conn, self._conn = self._conn, None
        self.connected = False
        if conn is not None:
            await conn.close()

    async def _connect_or_relay(self) -> int:
        # a pass of run(): connect, or relay until the connection drops
        if self._conn is None:
            await self._connect()
            return 0
        return await self._relay(None, None)

    async def _connect(self) -> None:
        self._conn = await self.connect()
        self.connected = True
        self._connections += 1
        if self._connections > 1:
            self.stats.reconnects += 1
            log.info("listener.reconnected")
        self.waker.wake("reconnect")

    async def _relay(self, timeout_s: float | None, stop_after: int | None) -> int:
        assert self._conn is not None
        woken = 0
        try:
            async for channel, payload in channel_notifications(
                self._conn, "listen", timeout_s=timeout_s, stop_after=stop_after
            ):
                if channel == CANCEL_CHANNEL:
                    self._cancel(payload)
                elif not self.cfg.queues or payload in self.cfg.queues:
                    self.stats.last_notify_monotonic = self.clock.monotonic()
                    self.waker.wake("notify")
                    woken += 1
        except BackendUnavailable as exc:
            log.warning("listener.lost", extra={"error": str(exc)})
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise
        return woken

    def _cancel(self, payload: str) -> None:
        if self.on_cancel is None:
            return
        try:
            job_id = uuid.UUID(payload)
        except ValueError:
            log.warning("listener.bad_cancel", extra={"payload": payload[:100]})
            return
        self.on_cancel(job_id)
