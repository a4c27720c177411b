"""One typed function per named statement of ``sql/queries/snapshot.sql`` (``jobsd export``).

Everything is read in one read-only REPEATABLE READ transaction (the connection is
not autocommit: the first statement begins it, closing the connection ends it), so
every statement sees the same moment of the database; jobs stream from a server-side
cursor, so a large table is never one list in memory.

With a read replica (``read_url``) the transaction runs there when it answers the
connection, else on the primary; a replica lost midway fails the export (its output
has begun), as a primary lost midway does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import psycopg
from psycopg.rows import dict_row

from jobsd.errors import BackendUnavailable
from jobsd.store.connect import connect
from jobsd.store.db import SyncConn, db_errors
from jobsd.store.named import Row, run_named_sync, sql_text
from jobsd.store.replica import ReplicaGate, replica_lag_sync

__all__ = ["SnapshotReader", "consistent_view"]

_FETCH_ROWS = 2000  # jobs per round trip of the server-side cursor


class SnapshotReader:
    """The statements of a snapshot, all in the one read transaction of ``conn``."""

    def __init__(self, conn: SyncConn, *, replica: bool = False) -> None:
        self._conn = conn
        self.replica = replica
        """True: the transaction runs on the read replica."""

    @property
    def user(self) -> str:
        """Return the database role reading."""
        return str(self._conn.info.user)

    def meta(self) -> Row:
        """Read the moment, the database, and whether jobsd's schema exists."""
        with db_errors("export"):
            return run_named_sync(self._conn, "snapshot_meta", {})[0]

    def schema(self) -> Row:
        """Read the schema version and whether the role sees every org's jobs."""
        with db_errors("export"):
            return run_named_sync(self._conn, "snapshot_schema", {})[0]

    def lag_s(self) -> float | None:
        """Return the delay of the server read behind its primary (``replica_lag``)."""
        return replica_lag_sync(self._conn)

    def queues(self) -> list[Row]:
        """Read every queue with its controls and open jobs by state."""
        with db_errors("export"):
            return run_named_sync(self._conn, "snapshot_queues", {})

    def jobs(self) -> Iterator[Row]:
        """Yield the open jobs, fetched a few thousand at a time."""
        with (
            db_errors("export"),
            self._conn.cursor(name="jobsd_snapshot_jobs", row_factory=dict_row) as cur,
        ):
            cur.itersize = _FETCH_ROWS
            cur.execute(sql_text("snapshot_jobs"))
            yield from cur


@contextmanager
def consistent_view(url: str, *, read_url: str | None = None) -> Iterator[SnapshotReader]:
    """Open the read-only REPEATABLE READ connection of one snapshot: to ``read_url``
    (a replica) when it answers, else to ``url``."""
    with ExitStack() as stack:
        conn: SyncConn | None = None
        if read_url:
            try:
                conn = stack.enter_context(
                    connect(
                        read_url,
                        application_name="jobsd-export",
                        operation="export from the read replica",
                        autocommit=False,
                        writable=False,
                    )
                )
            except BackendUnavailable as exc:
                ReplicaGate().failed(exc)  # logs read_replica.unavailable
        replica = conn is not None
        if conn is None:
            conn = stack.enter_context(
                connect(url, application_name="jobsd-export", operation="export", autocommit=False)
            )
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        yield SnapshotReader(conn, replica=replica)
