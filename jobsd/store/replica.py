"""Reads that may lag, on a streaming replica (``JOBSD_READ_DATABASE_URL``), the primary
answering whenever the replica does not.

A read goes to the replica only while its ``ReplicaGate`` is open. When the replica
is unavailable (refused, down, a pool timeout, a statement cancelled by a recovery
conflict: BackendUnavailable), ``try_replica`` says so (None) and the caller answers
the same request from the primary; the gate then stays closed for ``RETRY_AFTER_S``,
so the requests meanwhile go straight to the primary instead of each waiting for the
replica. ``read_replica.unavailable`` is logged once per episode, ``read_replica.back``
at the first read it answers again. Each read served by the replica also reads the
replica's delay (``replica_lag``, one small statement on the same connection).

Connections to the replica are opened with ``writable=False`` (``store.connect``):
the TLS policy applies as to every connection, only ``target_session_attrs`` is not
forced to ``read-write``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from jobsd.errors import BackendUnavailable
from jobsd.store.connect import check_url, open_connection_async
from jobsd.store.db import AsyncConn, SyncConn, db_errors
from jobsd.store.named import run_named, run_named_sync

__all__ = [
    "RETRY_AFTER_S",
    "Lagged",
    "ReplicaGate",
    "ReplicaReader",
    "replica_lag",
    "replica_lag_sync",
    "try_replica",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_AFTER_S = 5.0
"""After a failure of the replica, reads go straight to the primary this long."""


@dataclass(frozen=True, slots=True)
class Lagged(Generic[T]):
    """A read's answer and where it came from."""

    value: T
    replica: bool
    """True: read on the replica; False: on the primary (no delay)."""
    lag_s: float | None = None
    """The replica's delay in seconds (None: unknown, or read on the primary)."""


class ReplicaGate:
    """Whether reads may try the replica now: closed for ``retry_after_s`` after it failed."""

    def __init__(
        self,
        retry_after_s: float = RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._closed_until = 0.0
        self.down = False
        """True from a failure until the replica answers a read again."""

    def is_open(self) -> bool:
        """Say whether to try the replica: never failed, or failed long enough ago."""
        return self._clock() >= self._closed_until

    def failed(self, exc: BaseException) -> None:
        """Close the gate for ``retry_after_s``; log the first failure of an episode."""
        self._closed_until = self._clock() + self.retry_after_s
        if not self.down:
            self.down = True
            log.warning(
                "read_replica.unavailable",
                extra={"error": " ".join(str(exc).split()), "retry_after_s": self.retry_after_s},
            )

    def answered(self) -> None:
        """Record a read the replica answered; log the end of an episode."""
        if self.down:
            self.down = False
            log.info("read_replica.back")


async def replica_lag(conn: AsyncConn) -> float | None:
    """Return the delay of the server of ``conn`` behind its primary, in seconds
    (0 on a primary or a caught-up replica; None: unknown)."""
    with db_errors("read of the replica's delay"):
        rows = await run_named(conn, "replica_lag", {})
    value = rows[0]["lag_s"] if rows else None
    return None if value is None else float(value)


def replica_lag_sync(conn: SyncConn) -> float | None:
    """Return the delay of the server of ``conn``; see ``replica_lag`` (sync)."""
    with db_errors("read of the replica's delay"):
        rows = run_named_sync(conn, "replica_lag", {})
    value = rows[0]["lag_s"] if rows else None
    return None if value is None else float(value)


async def try_replica(
    gate: ReplicaGate,
    connection: Callable[[], AbstractAsyncContextManager[AsyncConn]],
    work: Callable[[AsyncConn], Awaitable[T]],
    *,
    before: Callable[[AsyncConn], Awaitable[None]] | None = None,
) -> Lagged[T] | None:
    """Run ``before(conn)`` then ``work(conn)`` on a replica connection, and read its delay.

    Return None when the gate is closed or the replica is unavailable (the gate then
    closes): the caller reads on the primary. Anything else ``work`` raises (a refusal
    such as JobNotFound, an error of the statement) is raised.
    """
    if not gate.is_open():
        return None
    try:
        async with connection() as conn:
            if before is not None:
                await before(conn)
            value = await work(conn)
            lag_s = await replica_lag(conn)
    except BackendUnavailable as exc:
        gate.failed(exc)
        return None
    gate.answered()
    return Lagged(value, True, lag_s)


class ReplicaReader:
    """A command's reads that may lag: on the replica while it answers, else on the
    primary; one connection to each, opened at first use and kept (``jobsd top``).

    ``retry_on`` are the refusals of ``work`` that the replica may give wrongly
    because it lags (a job or a token created a moment ago): read again on the primary.
    The TLS policy is applied to ``read_url`` at once (ConfigError), so a refused
    replica URL is an error, not a silent fallback.
    """

    def __init__(
        self,
        url: str,
        read_url: str | None,
        *,
        application_name: str,
        operation: str,
        retry_on: tuple[type[Exception], ...] = (),
    ) -> None:
        if read_url:
            check_url(read_url)
        self.url, self.read_url = url, read_url
        self.application_name, self.operation = application_name, operation
        self.retry_on = retry_on
        self.gate = ReplicaGate()
        self._conns: dict[bool, AsyncConn] = {}

    @asynccontextmanager
    async def _connection(self, replica: bool) -> AsyncIterator[AsyncConn]:
        """Yield the kept connection (opened if needed); one that lost its server is closed."""
        conn = self._conns.get(replica)
        if conn is None or conn.closed:
            url = self.read_url if replica else self.url
            assert url is not None
            conn = await open_connection_async(
                url,
                application_name=self.application_name,
                operation=self.operation,
                writable=not replica,
            )
            self._conns[replica] = conn
        try:
            yield conn
        except BackendUnavailable:
            del self._conns[replica]
            await conn.close()
            raise

    async def read(self, work: Callable[[AsyncConn], Awaitable[T]]) -> Lagged[T]:
        """Run ``work(conn)`` on the replica, or on the primary when the replica is
        not set, is unavailable or refused with one of ``retry_on``."""
        if self.read_url:
            try:
                served = await try_replica(self.gate, lambda: self._connection(True), work)
            except self.retry_on:
                served = None
            if served is not None:
                return served
        async with self._connection(False) as conn:
            return Lagged(await work(conn), False)

    async def aclose(self) -> None:
        """Close the kept connections."""
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            await conn.close()
