"""Wake long-polling requests when their job reaches a terminal state.

Model: the API process holds ONE connection with ``LISTEN jobsd_done`` (migration
0002 notifies when a job becomes succeeded, failed or cancelled; since migration 0012
the payload is ``md5(key || id)``, so a role without the key learns no id). Each
waiting request registers a ``Watch`` for its job id before it reads the job, so a
notification cannot slip between the read and the wait; a notification sets the
watches of that id, and the request reads the job again. After every (re)connect
every watch is set too: notifications sent while the connection was down are lost,
and a re-read makes up for them. While the connection is down, waits still end at
their deadline with the current state.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
from anyio.abc import TaskStatus

from jobsd.errors import BackendUnavailable, DatabaseError
from jobsd.store.api import done_notify_key, done_payload
from jobsd.store.listen import notifications, open_listen_connection

__all__ = ["DONE_CHANNEL", "DoneWaiter", "Watch"]

log = logging.getLogger(__name__)

DONE_CHANNEL = "jobsd_done"


class Watch:
    """One request waiting for one job; re-armed after every wake-up."""

    def __init__(self, job_id: uuid.UUID) -> None:
        self.job_id = job_id
        self._event = anyio.Event()

    def wake(self) -> None:
        """Wake the request (or make its next wait return at once)."""
        self._event.set()

    async def wait(self, timeout_s: float) -> bool:
        """Wait for a wake-up; return False when ``timeout_s`` passed first."""
        with anyio.move_on_after(max(timeout_s, 0.0)):
            await self._event.wait()
        woken = self._event.is_set()
        if woken:
            self._event = anyio.Event()
        return woken


class DoneWaiter:
    """Hold the LISTEN connection on ``jobsd_done`` and fan notifications out to watches."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connected = False
        self.closing = False
        self.notifications = 0
        self.reconnects = 0
        self.last_notify_monotonic: float | None = None
        self._watches: dict[uuid.UUID, set[Watch]] = {}
        self._key: str | None = None
        self._payloads: dict[uuid.UUID, str] = {}

    @property
    def waiting(self) -> int:
        """Return the number of requests waiting."""
        return sum(len(w) for w in self._watches.values())

    @contextmanager
    def watch(self, job_id: uuid.UUID) -> Iterator[Watch]:
        """Register a watch for ``job_id`` for the duration of the block."""
        watch = Watch(job_id)
        self._watches.setdefault(job_id, set()).add(watch)
        if self.closing:
            watch.wake()
        try:
            yield watch
        finally:
            group = self._watches.get(job_id)
            if group is not None:
                group.discard(watch)
                if not group:
                    del self._watches[job_id]
                    self._payloads.pop(job_id, None)

    def wake_all(self) -> None:
        """Wake every waiting request (after a reconnect, or at shutdown)."""
        for group in self._watches.values():
            for watch in group:
                watch.wake()

    def close(self) -> None:
        """Make every current and future wait return at once: the server is stopping."""
        self.closing = True
        self.wake_all()

    def _deliver(self, payload: str) -> None:
        self.notifications += 1
        self.last_notify_monotonic = time.monotonic()
        # the payload is md5(key || id) (migration 0012): compare with the ids waited for
        key = self._key
        if key is None:
            return
        for job_id, group in list(self._watches.items()):
            expected = self._payloads.get(job_id)
            if expected is None:
                expected = self._payloads[job_id] = done_payload(key, job_id)
            if expected == payload:
                for watch in group:
                    watch.wake()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen forever, reconnecting with back-off; report started at once.

        The API must come up even while the database is down, so starting does not
        wait for the first connection.
        """
        task_status.started()
        first = True
        while True:
            conn = await open_listen_connection(
                self.url,
                DONE_CHANNEL,
                application_name="jobsd-api-listen",
                operation="listen for finished jobs",
            )
            try:
                async with conn:
                    try:
                        key = await done_notify_key(conn)
                    except DatabaseError as exc:
                        if isinstance(exc, BackendUnavailable):
                            raise
                        # a role without the key: long-polls wait for their deadline
                        log.warning("waiter.no_key", extra={"error": str(exc)})
                        key = None
                    if key != self._key:
                        self._key, self._payloads = key, {}
                    self.connected = True
                    if not first:
                        self.reconnects += 1
                        log.info("waiter.reconnected")
                    first = False
                    self.wake_all()
                    async for payload in notifications(conn, "listen for finished jobs"):
                        self._deliver(payload)
            except BackendUnavailable as exc:
                log.warning("waiter.lost", extra={"error": str(exc)})
            finally:
                self.connected = False
