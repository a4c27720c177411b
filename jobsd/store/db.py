"""Error translation, pooled connections, and the only place transient errors are retried.

Connections and pools are opened by ``jobsd.store.connect`` (TLS policy, keepalives,
``application_name``); this module translates what psycopg raises into jobsd errors,
once, in the store function that runs a statement, and hands out pooled connections.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import psycopg
import psycopg.errors
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_never,
    wait_exponential,
    wait_random,
)

from jobsd.errors import (
    BackendUnavailable,
    DatabaseError,
    InvalidPayload,
    OrgQuotaExceeded,
    QueueFull,
    TransientConflict,
    UnknownQueue,
)

__all__ = [
    "AsyncConn",
    "AsyncPool",
    "SyncConn",
    "SyncPool",
    "acquire",
    "acquire_sync",
    "db_errors",
    "make_async_pool",
    "transient_retries",
]

log = logging.getLogger(__name__)

# Any connection: jobsd's own (dict rows) or a caller's (any row factory). Store
# functions open their own dict-row cursors, so they take either.
AsyncConn = psycopg.AsyncConnection[Any]
SyncConn = psycopg.Connection[Any]
# jobsd's own pools: autocommit connections with dict rows (see store.connect).
AsyncPool = AsyncConnectionPool[psycopg.AsyncConnection[DictRow]]
SyncPool = ConnectionPool[psycopg.Connection[DictRow]]


def make_async_pool(
    url: str, *, name: str, min_size: int, max_size: int, timeout_s: float
) -> AsyncPool:
    """Create (unopened) an async pool: see ``jobsd.store.connect.make_async_pool``.

    Kept here for the tests that import it from this module.
    """
    from jobsd.store import connect  # connect imports this module

    return connect.make_async_pool(
        url, name=name, min_size=min_size, max_size=max_size, timeout_s=timeout_s
    )


@contextmanager
def db_errors(operation: str) -> Iterator[None]:
    """Translate psycopg errors raised inside the block into jobsd errors naming ``operation``."""
    try:
        yield
    except PoolTimeout as exc:
        raise BackendUnavailable(f"{operation} failed: database unavailable ({exc})") from exc
    except psycopg.errors.ForeignKeyViolation as exc:
        if exc.diag.constraint_name == "jobs_queue_fkey":
            raise UnknownQueue(_queue_from_detail(exc.diag.message_detail)) from exc
        raise DatabaseError(f"{operation} failed: {exc}") from exc
    except (
        psycopg.errors.UntranslatableCharacter,
        psycopg.errors.CharacterNotInRepertoire,
        psycopg.errors.InvalidTextRepresentation,
    ) as exc:
        raise InvalidPayload(f"{operation} failed: {exc.diag.message_primary}") from exc
    except (  # class 40: the statement was rolled back, retrying it is safe
        psycopg.errors.TransactionRollback,
        psycopg.errors.SerializationFailure,
        psycopg.errors.DeadlockDetected,
    ) as exc:
        raise TransientConflict(
            f"{operation} failed: conflict with a concurrent transaction, retry ({exc})"
        ) from exc
    except psycopg.OperationalError as exc:
        raise BackendUnavailable(f"{operation} failed: database unavailable ({exc})") from exc
    except psycopg.InterfaceError as exc:
        raise BackendUnavailable(f"{operation} failed: connection unusable ({exc})") from exc
    except psycopg.Error as exc:
        if exc.sqlstate == QUEUE_FULL_SQLSTATE:
            raise _queue_full(exc) from exc
        if exc.sqlstate == ORG_QUOTA_SQLSTATE:
            raise _org_quota(exc) from exc
        raise DatabaseError(f"{operation} failed: {exc}") from exc


# Raised by the admission trigger of migration 0008 when a queue is at capacity.
QUEUE_FULL_SQLSTATE = "JQ001"


# Raised by the org quota trigger of migration 0012 when an org holds its open jobs.
ORG_QUOTA_SQLSTATE = "JQ003"


def _org_quota(exc: psycopg.Error) -> OrgQuotaExceeded:
    try:
        detail = json.loads(exc.diag.message_detail or "{}")
        return OrgQuotaExceeded(str(detail["queue"]), int(detail["org_open_limit"]))
    except (ValueError, KeyError, TypeError):
        return OrgQuotaExceeded("?")


def _queue_full(exc: psycopg.Error) -> QueueFull:
    try:
        detail = json.loads(exc.diag.message_detail or "{}")
        return QueueFull(str(detail["queue"]), int(detail["capacity"]))
    except (ValueError, KeyError, TypeError):
        return QueueFull("?")


@asynccontextmanager
async def acquire(pool: AsyncPool, operation: str) -> AsyncIterator[AsyncConn]:
    """Take a pooled connection; a pool timeout becomes BackendUnavailable naming ``operation``.

    Only taking the connection is translated here: the statements of the block are
    translated by the store functions that run them.
    """
    with db_errors(operation):
        conn = await pool.getconn()
    try:
        yield conn
    finally:
        await pool.putconn(conn)


@contextmanager
def acquire_sync(pool: SyncPool, operation: str) -> Iterator[SyncConn]:
    """Take a connection from a sync pool; see ``acquire``."""
    with db_errors(operation):
        conn = pool.getconn()
    try:
        yield conn
    finally:
        pool.putconn(conn)


def _queue_from_detail(detail: str | None) -> str:
    # Key (queue)=(mail) is not present in table "queues".
    if detail and "=(" in detail:
        return detail.split("=(", 1)[1].split(")", 1)[0]
    return "?"


def transient_retries(
    operation: str,
    *,
    max_wait_s: float = 5.0,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> AsyncRetrying:
    """Retry a block forever on BackendUnavailable, backing off up to ``max_wait_s``.

    For the daemon's own loops: the database going away must never crash it. ``sleep``
    waits out the back-off (the daemon passes its clock's); None is anyio's.
    """

    def _log(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "db.retrying",
            extra={"operation": operation, "attempt": state.attempt_number, "error": str(exc)},
        )

    return AsyncRetrying(
        retry=retry_if_exception_type(BackendUnavailable),
        # exponential from 50 ms up to max_wait_s, plus up to 200 ms of jitter
        wait=wait_exponential(multiplier=0.05, max=max_wait_s) + wait_random(0, 0.2),
        stop=stop_never,
        before_sleep=_log,
        reraise=True,
        sleep=sleep if sleep is not None else anyio.sleep,
    )
