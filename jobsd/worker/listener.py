"""LISTEN on a dedicated connection and wake the claimer when work arrives.

The NOTIFY payload is a queue name; a daemon that serves some queues only ignores the
others. After every (re)connection the claimer is woken too: notifications sent while
the connection was down are lost, and an immediate poll makes up for them.
"""

from __future__ import annotations

import logging
import time

import anyio
from anyio.abc import TaskStatus

from jobsd.errors import BackendUnavailable
from jobsd.store.listen import notifications, open_listen_connection
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
            conn = await open_listen_connection(
                self.url, CHANNEL, application_name="jobsd-listen", operation="listen"
            )
            try:
                async with conn:
                    self.connected = True
                    if not first:
                        self.stats.reconnects += 1
                        log.info("listener.reconnected")
                    first = False
                    self.waker.wake("reconnect")
                    if not started:
                        started = True
                        task_status.started()
                    async for queue in notifications(conn, "listen"):
                        if not self.queues or queue in self.queues:
                            self.stats.last_notify_monotonic = time.monotonic()
                            self.waker.wake("notify")
            except BackendUnavailable as exc:
                log.warning("listener.lost", extra={"error": str(exc)})
            finally:
                self.connected = False
