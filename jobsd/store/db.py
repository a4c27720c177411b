"""Error translation, pooled connections, and the only place transient errors are retried.

Connections and pools are opened by ``jobsd.store.connect`` (TLS policy, keepalives,
``application_name``); this module translates what psycopg raises into jobsd errors,
once, in the store function that runs a statement, and hands out pooled connections.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
import psycopg.errors
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from jobsd.errors import (
    BackendUnavailable,
    DatabaseError,
    InvalidPayload,
    NoWritableServer,
    OrgQuotaExceeded,
    PayloadTooLarge,
    QueueFull,
    TransientConflict,
    UnknownQueue,
)

__all__ = [
    "AsyncConn",
    "AsyncPool",
    "DeadlinePool",
    "SyncConn",
    "SyncPool",
    "acquire",
    "acquire_sync",
    "cause_of",
    "db_errors",
    "is_read_only",
    "is_unavailable",
    "make_async_pool",
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
        why = _pool_connect_error()
        said = f": {why}" if why else ""
        if is_read_only(exc) or _pool_found_read_only():
            raise NoWritableServer(
                f"{operation} failed: {_NO_WRITABLE_SERVER} ({exc}){said}"
            ) from exc
        raise BackendUnavailable(f"{operation} failed: database unavailable ({exc}){said}") from exc
    except psycopg.errors.ForeignKeyViolation as exc:
        if exc.diag.constraint_name == "jobs_queue_fkey":
            raise UnknownQueue(_queue_from_detail(exc.diag.message_detail)) from exc
        raise DatabaseError(f"{operation} failed: {exc}") from exc
    except psycopg.errors.CheckViolation as exc:
        limit = _SIZE_CHECKS.get(exc.diag.constraint_name or "")
        if limit is not None:
            raise PayloadTooLarge(f"{operation} failed: {limit}") from exc
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
    except psycopg.Error as exc:
        if exc.sqlstate == QUEUE_FULL_SQLSTATE:
            raise _queue_full(exc) from exc
        if exc.sqlstate == ORG_QUOTA_SQLSTATE:
            raise _org_quota(exc) from exc
        if is_read_only(exc):
            raise NoWritableServer(f"{operation} failed: {_NO_WRITABLE_SERVER} ({exc})") from exc
        if is_unavailable(exc):
            what = (
                "connection unusable"
                if isinstance(exc, psycopg.InterfaceError)
                else ("database unavailable")
            )
            raise BackendUnavailable(f"{operation} failed: {what} ({exc})") from exc
        raise DatabaseError(f"{operation} failed: {exc}") from exc


# The size caps of migration 0011, by constraint name.
_SIZE_CHECKS = {
    "jobs_payload_size": "payload over the database's limit of 1048576 bytes (as jsonb text)",
    "jobs_report_size": "report over the database's limit of 1048576 bytes (as jsonb text)",
    "jobs_progress_size": "progress over the database's limit of 1048576 bytes (as jsonb text)",
    "jobs_type_size": "job type longer than 200 characters",
    "jobs_dedup_key_size": "dedup_key longer than 512 characters",
    "jobs_org_id_size": "org_id longer than 255 bytes",
}


# SQLSTATEs that mean "the database is away": the connection is lost or refused, the
# server is shutting down or starting, a system error (I/O) that a restart cures.
# Retrying them (the daemon does, forever) is right. A statement timeout (57014) is
# retried too: the daemon's connections carry JOBSD_STATEMENT_TIMEOUT as a deadline
# against a silent link or a lock held elsewhere, and failing a job because another
# transaction held its row for a few seconds would be wrong (a statement that can
# never finish in time shows as outcomes waiting past JOBSD_OUTCOME_STALL_AFTER: the
# watchdog and /readyz go unhealthy). A full disk (53100) is the server's, not the
# statement's: any write fails until space is freed, then the same one succeeds, so
# failing the job whose outcome happened to be in flight would be wrong (fault
# scenario T10). Every other error is about the statement itself (resource and
# program limits of classes 53/54/55, data errors of class 22, ...): retrying the
# same statement fails the same way, so it is poison, raised as DatabaseError for its
# caller to isolate.
_UNAVAILABLE_CLASSES = ("08", "58")
_UNAVAILABLE_STATES = frozenset(
    {
        "53100",  # disk_full: every write fails until space is freed, whatever it holds
        "25P03",  # idle_in_transaction_session_timeout: the session is gone (a
        # transaction left open across a network cut); retried on a new connection
        "53300",  # too_many_connections: refused at connect, the statement never ran
        "57P01",  # admin_shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (starting up, recovering)
        "57P04",  # database_dropped
        "57P05",  # idle_session_timeout: the session is gone
        "57014",  # query_canceled: the statement's deadline (see above) or a cancel
    }
)


_NO_WRITABLE_SERVER = (
    "no writable database server: the server reached is read-only (a standby, or one "
    "not yet promoted); point JOBSD_DATABASE_URL at the primary, or list every server "
    "of the cluster in it (host=a,b) so that jobsd finds the one that accepts writes"
)
# libpq's words when target_session_attrs=read-write (or primary) turns a server down
_READ_ONLY_SESSION = ("session is read-only", "server is in hot standby mode")


class _LastConnectError(logging.Handler):
    """Remember when a pool last failed to connect and why: its timeout does not say."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message = ""
        self.at = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("error connecting in "):  # "error connecting in 'client': ..."
            self.message, self.at = text, time.monotonic()

    def recent(self) -> str:
        """Return the last failure's text if it is recent enough to explain a timeout."""
        fresh = time.monotonic() - self.at < _CONNECT_ERROR_FRESH_S
        return self.message if fresh else ""


_last_connect_error = _LastConnectError()
logging.getLogger("psycopg.pool").addHandler(_last_connect_error)
# a pool's failed attempt this recent explains its timeout
_CONNECT_ERROR_FRESH_S = 15.0


def _pool_found_read_only() -> bool:
    """Say whether a pool's latest failed connection found only read-only servers."""
    text = _last_connect_error.recent()
    return any(words in text for words in _READ_ONLY_SESSION)


def _pool_connect_error() -> str:
    """Return why a pool last failed to connect, in one line (its first), if recently."""
    text = _last_connect_error.recent()
    return text.splitlines()[0].split(": ", 1)[-1] if text else ""


def is_read_only(exc: BaseException) -> bool:
    """Say whether a psycopg error means the server reached takes no writes: a write
    refused as read-only (SQLSTATE 25006), or a connection that libpq turned down
    because no server it tried accepted writes."""
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate == "25006":
        return True
    if exc.sqlstate is not None or not isinstance(exc, psycopg.OperationalError):
        return False
    # a pool's timeout carries its last failed attempt down its chain of causes
    texts = []
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            break
        texts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    return any(words in text for text in texts for words in _READ_ONLY_SESSION)


def is_unavailable(exc: BaseException) -> bool:
    """Say whether a psycopg error means the database is away (retry) rather than
    that the statement cannot succeed (poison).

    An error without a SQLSTATE (connection refused, dropped, closed: raised by libpq
    or psycopg, not by the server) is unavailability.
    """
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    if is_read_only(exc):  # during a failover a primary appears within seconds
        return True
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return state in _UNAVAILABLE_STATES or state[:2] in _UNAVAILABLE_CLASSES


def cause_of(exc: BaseException) -> str:
    """Return a short, storable description of why the database refused a statement:
    the server's primary message and SQLSTATE, without its DETAIL (which may quote
    the whole refused row)."""
    cause = exc.__cause__ if isinstance(exc.__cause__, psycopg.Error) else exc
    if isinstance(cause, psycopg.Error) and cause.diag.message_primary:
        return f"{cause.diag.message_primary} (SQLSTATE {cause.sqlstate})"
    return str(exc).split("\n", 1)[0]


# Raised by the admission trigger of migration 0008 when a queue is at capacity.
QUEUE_FULL_SQLSTATE = "JQ001"


# Raised by the org quota trigger of migration 0012 when an org holds its open jobs.
ORG_QUOTA_SQLSTATE = "JQ003"


def _limit_detail(exc: psycopg.Error, limit_key: str) -> tuple[str, int] | None:
    """Read the queue and the limit from the JSON DETAIL a jobsd trigger raised with;
    None when the detail is missing or not that shape."""
    try:
        detail = json.loads(exc.diag.message_detail or "{}")
        return str(detail["queue"]), int(detail[limit_key])
    except (ValueError, KeyError, TypeError):
        return None


def _org_quota(exc: psycopg.Error) -> OrgQuotaExceeded:
    found = _limit_detail(exc, "org_open_limit")
    return OrgQuotaExceeded(*found) if found else OrgQuotaExceeded("?")


def _queue_full(exc: psycopg.Error) -> QueueFull:
    found = _limit_detail(exc, "capacity")
    return QueueFull(*found) if found else QueueFull("?")


class DeadlinePool(AsyncConnectionPool[psycopg.AsyncConnection[DictRow]]):
    """A pool whose blocks (``acquire``) are watched: a warning after ``warn_after_s``
    without an answer, abandoned after ``give_up_after_s``.

    For the daemon's services. The server cancels a statement of theirs after
    ``JOBSD_STATEMENT_TIMEOUT`` (set on each connection), so a block still waiting a
    second later is waiting for a database it cannot reach (a partition, a blackhole:
    not even the cancellation comes back): ``db.no_answer`` is logged then. The block
    keeps waiting, since a link that heals delivers the answer at once, until
    ``give_up_after_s``. A link that is down is dropped sooner by the kernel
    (``tcp_user_timeout``).
    """

    warn_after_s: float | None = None
    give_up_after_s: float | None = None


def _no_answer(operation: str, waited_s: float, warned: list[bool]) -> None:
    warned.append(True)
    log.warning("db.no_answer", extra={"operation": operation, "waited_s": waited_s})


@asynccontextmanager
async def acquire(pool: AsyncPool, operation: str) -> AsyncIterator[AsyncConn]:
    """Take a pooled connection; a pool timeout becomes BackendUnavailable naming ``operation``.

    Only taking the connection is translated here: the statements of the block are
    translated by the store functions that run them. On a ``DeadlinePool`` a block
    without an answer after ``warn_after_s`` logs ``db.no_answer``; one that outlives
    ``give_up_after_s`` is cancelled, its connection closed (psycopg gives up on a
    statement interrupted twice) and discarded, and BackendUnavailable raised: the
    service's pass is retried on a new connection.
    """
    with db_errors(operation):
        conn = await pool.getconn()
    try:
        if not isinstance(pool, DeadlinePool) or pool.give_up_after_s is None:
            yield conn
            return
        # only the daemon's pools are watched, and the daemon runs on anyio; its
        # cancellation is delivered again and again, so psycopg gives up on a statement
        # that the server never answers (a single asyncio cancellation waits for it)
        import anyio

        warned: list[bool] = []
        warn_s = pool.warn_after_s or pool.give_up_after_s
        # a timer, not a task: this is every statement of the daemon's hot path
        timer = asyncio.get_running_loop().call_later(warn_s, _no_answer, operation, warn_s, warned)
        try:
            with anyio.move_on_after(pool.give_up_after_s) as scope:
                yield conn
        finally:
            timer.cancel()
        if scope.cancelled_caught:
            raise BackendUnavailable(
                f"{operation} failed: no answer from the database within {pool.give_up_after_s:g} s"
            )
        if warned:
            log.info("db.answered", extra={"operation": operation})
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
