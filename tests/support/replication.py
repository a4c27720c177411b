"""A primary and a streaming standby on loopback, and the failovers between them.

``ReplicatedPair`` starts a primary (``EmbeddedPostgres``) with a database migrated for
jobsd and a standby made by ``pg_basebackup``, synchronous (the primary waits for the
standby's flush before a commit returns, ``synchronous_standby_names = '*'``) or
asynchronous. ``url`` is the multi-host URL every jobsd process gets: both ports, with
``target_session_attrs=read-write``, so a client reaches whichever server is the primary.

``failover()`` kills the primary (SIGKILL of the postmaster and its children), waits an
orchestrator's delay, promotes the standby, and builds a new standby on the dead
primary's port from the new primary, so the URL stays valid through any number of
failovers. Synchronous mode follows what an orchestrator such as Patroni does: the new
primary commits without a standby until its new standby streams, then waits for it
again (``synchronous_standby_names`` set by ``ALTER SYSTEM``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import psycopg
from psycopg.conninfo import make_conninfo

from jobsd.dev.embedded import EmbeddedPostgres
from jobsd.store.migrate import migrate_sync

__all__ = ["Failover", "ReplicatedPair"]

_SYNC_NAMES = "*"


@dataclass
class Failover:
    """When one failover's steps happened (monotonic seconds)."""

    lag_bytes: int
    """WAL the standby had not flushed a moment before the kill (what asynchronous
    replication may lose)."""
    killed_at: float
    promoted_at: float
    writable_at: float
    standby_streaming_at: float


class ReplicatedPair:
    """A primary and its standby; ``failover()`` swaps their roles."""

    def __init__(self, *, synchronous: bool, dbname: str = "jobsd_failover") -> None:
        self.synchronous = synchronous
        self.dbname = dbname
        self._generation = 0
        # synchronous from the moment its first standby streams (_new_standby)
        self.primary = EmbeddedPostgres()
        self.standby: EmbeddedPostgres | None = None
        self.failovers: list[Failover] = []
        self.primary.start()
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')
        migrate_sync(self.primary.url(dbname))
        self.standby = self._new_standby(self.primary, port=None)

    @property
    def url(self) -> str:
        """The multi-host URL of the pair: whichever server is the primary answers."""
        assert self.standby is not None
        return make_conninfo(
            "",
            host="127.0.0.1,127.0.0.1",
            port=f"{self.primary.port},{self.standby.port}",
            dbname=self.dbname,
            user="postgres",
            target_session_attrs="read-write",
        )

    def _new_standby(self, primary: EmbeddedPostgres, port: int | None) -> EmbeddedPostgres:
        """Make a standby of ``primary`` (on ``port``, or a free one) and wait until it
        streams (and, in synchronous mode, until the primary counts it as synchronous)."""
        self._generation += 1
        name = f"standby{self._generation}"
        standby = EmbeddedPostgres(port=port, standby_of=f"{primary.url()}?application_name={name}")
        standby.start()
        if self.synchronous:
            with psycopg.connect(primary.url(), autocommit=True) as conn:
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{_SYNC_NAMES}'")
                conn.execute("SELECT pg_reload_conf()")
        self._wait_streaming(primary, name)
        return standby

    def _wait_streaming(self, primary: EmbeddedPostgres, name: str, timeout_s: float = 60) -> None:
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout_s
        while True:
            with psycopg.connect(primary.url(), autocommit=True) as conn:
                row = conn.execute(
                    "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                    (name,),
                ).fetchone()
            if row == ("streaming", want):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"standby {name} not streaming ({want}) after {timeout_s} s: {row}"
                )
            time.sleep(0.05)

    def replication_lag_bytes(self) -> int:
        """Return how many bytes of WAL the standby has not flushed yet."""
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)), 0)::bigint "
                "FROM pg_stat_replication"
            ).fetchone()
        return int(row[0]) if row else 0

    def failover(self, *, detect_s: float = 0.5) -> Failover:
        """Kill the primary, promote the standby after ``detect_s``, rebuild a standby."""
        assert self.standby is not None
        old, new = self.primary, self.standby
        lag_bytes = self.replication_lag_bytes()
        killed_at = time.monotonic()
        old.kill()
        time.sleep(detect_s)
        promoted_at = time.monotonic()
        new.promote()
        if self.synchronous:
            # no standby yet: commit alone until one streams (as an orchestrator would)
            with psycopg.connect(new.url(), autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = ''")
                conn.execute("SELECT pg_reload_conf()")
        writable_at = time.monotonic()
        port = old.port
        old.cleanup()
        self.primary = new
        self.standby = self._new_standby(new, port=port)
        step = Failover(lag_bytes, killed_at, promoted_at, writable_at, time.monotonic())
        self.failovers.append(step)
        return step

    def cleanup(self) -> None:
        """Stop both servers and remove their directories."""
        for cluster in (self.standby, self.primary):
            if cluster is not None:
                with contextlib.suppress(Exception):
                    cluster.cleanup()
