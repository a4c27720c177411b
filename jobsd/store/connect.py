"""Open every connection and create every pool: the TLS policy, keepalives, application_name.

Every connection jobsd opens comes from here (commands, the daemon, the API, the
client's pools, migrations, snapshots), so none can skip the TLS check of
``store.tls``: a plaintext TCP connection is refused with ConfigError unless
``JOBSD_ALLOW_INSECURE`` is set, and then a warning is logged once per URL. A
connection the caller made (``conn=``, a SQLAlchemy Session) is the caller's and is
not checked.

Every connection notices a dead link within about 5 s instead of never: TCP
keepalives probe an idle connection (LISTEN and lock connections idle for hours)
after 3 s and give up after 2 lost probes, and ``tcp_user_timeout`` drops a
connection whose sent data (a statement, a probe) stays unacknowledged for 5 s; a
connection attempt gives up after ``connect_timeout``. A peer that acknowledges but
never answers (a stuck proxy, a hung server) is left to the statement deadlines of
the daemon's pool (``make_async_pool(statement_timeout_s=...)``). Each connection is
named ``jobsd-<role>`` in ``pg_stat_activity``. A failure to connect is
BackendUnavailable naming the operation (``db_errors``), translated once, here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from jobsd.store.db import AsyncPool, DeadlinePool, SyncPool, db_errors
from jobsd.store.named import run_named, run_named_sync
from jobsd.store.tls import auth_params, require_secure_connection, unverified_reason

__all__ = [
    "check_url",
    "connect",
    "connect_async",
    "make_async_pool",
    "make_sync_pool",
    "open_connection_async",
    "trust_local_cluster",
]

OwnConn = psycopg.Connection[DictRow]
OwnAsyncConn = psycopg.AsyncConnection[DictRow]

# libpq parameters (tcp_user_timeout: libpq >= 12, Linux; ignored elsewhere)
_KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 3,
    "keepalives_interval": 1,
    "keepalives_count": 2,
    "tcp_user_timeout": 5000,
    "connect_timeout": 5,
}
# the client warns about a block this long after the server should have cancelled it
_DEADLINE_MARGIN_S = 1.0
# libpq's environment variable for target_session_attrs (the operator's choice wins)
_TSA_ENV = "PGTARGETSESSIONATTRS"
# a failed reconnect of a pool is retried on the next demand after this long at most
_POOL_RECONNECT_TIMEOUT_S = 10.0

log = logging.getLogger(__name__)

_warned: set[str] = set()
_trusted: set[str] = set()


def trust_local_cluster(url: str) -> None:
    """Accept plaintext TCP to ``url`` from now on, in this process, without a warning.

    For the throwaway cluster that ``jobsd dev`` starts itself on 127.0.0.1: it is
    local and dies with the process, so ``JOBSD_ALLOW_INSECURE`` is not asked for.
    """
    _trusted.add(url)


def check_url(url: str) -> str | None:
    """Apply the TLS policy to ``url``: raise ConfigError, or say why it is allowed though
    insecure (None when it is secure).

    Commands that start long-running work call it first, so a refusal is their first
    word; every connection and pool of this module calls it anyway.
    """
    if url in _trusted:
        return None
    reason = require_secure_connection(url, warn=url not in _warned)
    if reason is not None:
        _warned.add(url)
        return reason
    unverified = unverified_reason(url)
    if unverified is not None and url not in _warned:
        _warned.add(url)
        log.warning("security.server_not_verified", extra={"reason": unverified})
    return None


def _params(url: str, application_name: str, *, writable: bool = True) -> dict[str, Any]:
    check_url(url)
    # a value the URL sets itself (a longer connect_timeout for a far server) wins
    given = conninfo_to_dict(url)
    link = {k: v for k, v in _KEEPALIVES.items() if k not in given}
    if writable and "target_session_attrs" not in given and not os.environ.get(_TSA_ENV):
        # jobsd writes: of the servers a URL lists (host=a,b), take the one that accepts
        # writes, so that after a failover every reconnect finds the new primary
        link["target_session_attrs"] = "read-write"
    extra = {} if url in _trusted else auth_params(url)
    return {"application_name": application_name, **link, **extra}


@contextmanager
def connect(
    url: str,
    *,
    application_name: str,
    operation: str,
    autocommit: bool = True,
    writable: bool = True,
) -> Iterator[OwnConn]:
    """Open a one-off sync connection (dict rows) for the block, and close it after.

    A failure to connect is BackendUnavailable naming ``operation``. ``writable``
    (default) takes only a server that accepts writes; false takes any (a replica).
    """
    params = _params(url, application_name, writable=writable)
    with db_errors(operation):
        conn = psycopg.Connection.connect(
            url, autocommit=autocommit, row_factory=dict_row, **params
        )
    try:
        yield conn
    finally:
        conn.close()


async def open_connection_async(
    url: str, *, application_name: str, operation: str, writable: bool = True
) -> OwnAsyncConn:
    """Open a long-lived async autocommit connection (dict rows); the caller closes it.

    For dedicated connections (LISTEN, locks) that outlive one block of code.
    """
    params = _params(url, application_name, writable=writable)
    with db_errors(operation):
        return await psycopg.AsyncConnection.connect(
            url, autocommit=True, row_factory=dict_row, **params
        )


@asynccontextmanager
async def connect_async(
    url: str, *, application_name: str, operation: str, writable: bool = True
) -> AsyncIterator[OwnAsyncConn]:
    """Open a one-off async autocommit connection (dict rows) for the block."""
    conn = await open_connection_async(
        url, application_name=application_name, operation=operation, writable=writable
    )
    try:
        yield conn
    finally:
        await conn.close()


def make_async_pool(
    url: str,
    *,
    name: str,
    min_size: int,
    max_size: int,
    timeout_s: float,
    statement_timeout_s: float | None = None,
    give_up_after_s: float | None = None,
    writable: bool = True,
    on_connect: Callable[[OwnAsyncConn], Awaitable[None]] | None = None,
) -> AsyncPool:
    """Create (unopened) an async pool of autocommit connections named ``jobsd-<name>``.

    A failed reconnect is retried on the next demand. Connections are autocommit: a
    single statement commits on its own in one round trip; multi-statement work opens
    an explicit ``conn.transaction()``.

    With ``statement_timeout_s`` (the daemon's pool) each connection gets it as its
    ``statement_timeout`` (the server cancels a slow statement, which rolls back: safe
    to retry), and ``idle_in_transaction_session_timeout`` and, where the server has
    it, ``client_connection_check_interval``, so a session whose client is cut off
    releases its locks. The pool is then a ``DeadlinePool``: ``acquire`` warns
    (``db.no_answer``) about a block without an answer ``statement_timeout_s`` + 1 s
    after it began (the database is unreachable), and gives up on it after
    ``give_up_after_s`` (default: 6 statement timeouts, at least 30 s), raising
    BackendUnavailable. ``writable`` false lets the pool use a read-only server (a
    replica for reads that may lag). ``on_connect`` runs on each new connection before
    the pool hands it out (the daemon prepares its claim there).
    """
    options = _pool_options(url, name, min_size, max_size, timeout_s, writable=writable)
    settings = dict(_SESSION_SETTINGS)
    if statement_timeout_s is not None:
        settings |= {
            "statement_timeout": _ms(statement_timeout_s),
            "idle_in_transaction_session_timeout": _ms(2 * statement_timeout_s),
            "client_connection_check_interval": _ms(min(statement_timeout_s, 1.0)),
        }

    async def configure(conn: psycopg.AsyncConnection[DictRow]) -> None:
        await run_named(conn, "workers_session_deadlines", {"settings": Jsonb(settings)})
        if on_connect is not None:
            await on_connect(conn)

    if statement_timeout_s is None:
        return AsyncConnectionPool(
            url, connection_class=psycopg.AsyncConnection[DictRow], configure=configure, **options
        )
    pool = DeadlinePool(
        url, connection_class=psycopg.AsyncConnection[DictRow], configure=configure, **options
    )
    pool.warn_after_s = statement_timeout_s + _DEADLINE_MARGIN_S
    pool.give_up_after_s = (
        give_up_after_s if give_up_after_s is not None else max(30.0, 6 * statement_timeout_s)
    )
    return pool


# Set on every connection of jobsd's pools. No JIT: jobsd's statements are short, and
# the claim's estimated cost passes the JIT thresholds once `jobs` is analyzed mid-drain
# (its lateral count of an org's running jobs is costed per candidate, though it runs
# only under an org limit): each claim then spent 0.75-1 s compiling
# (docs/decisions.md, "No JIT on jobsd's sessions").
_SESSION_SETTINGS = {"jit": "off"}


def _ms(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


def make_sync_pool(
    url: str,
    *,
    name: str,
    min_size: int,
    max_size: int,
    timeout_s: float,
    writable: bool = True,
) -> SyncPool:
    """Create (unopened) a sync pool, for threads and scripts; see ``make_async_pool``."""

    def configure(conn: psycopg.Connection[DictRow]) -> None:
        run_named_sync(conn, "workers_session_deadlines", {"settings": Jsonb(_SESSION_SETTINGS)})

    return ConnectionPool(
        url,
        connection_class=psycopg.Connection[DictRow],
        configure=configure,
        **_pool_options(url, name, min_size, max_size, timeout_s, writable=writable),
    )


def _pool_options(
    url: str, name: str, min_size: int, max_size: int, timeout_s: float, *, writable: bool
) -> dict[str, Any]:
    params = _params(url, f"jobsd-{name}", writable=writable)
    return {
        "kwargs": {"autocommit": True, "row_factory": dict_row, **params},
        "min_size": min_size,
        "max_size": max_size,
        "name": name,
        "timeout": timeout_s,
        "reconnect_timeout": _POOL_RECONNECT_TIMEOUT_S,
        "open": False,
    }
