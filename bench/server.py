"""The bench's Postgres: an embedded cluster or a given server, a fresh database per case.

A migrated template database is made once; every case runs in a ``CREATE DATABASE ...
TEMPLATE`` clone that is dropped afterwards, so no case sees another's rows, dead
tuples or trigger switches.

CPU accounting reads ``/proc``: the postmaster's own and reaped children's time plus
the time of its live children (backends, autovacuum, walwriter...). It works for any
server on this machine that we may read (embedded: always); else it reports None.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from jobsd.dev.embedded import EmbeddedPostgres
from jobsd.store.migrate import migrate_sync

__all__ = ["BenchServer", "ServerInfo", "cpu_of", "db_url_for"]

_TICK = os.sysconf("SC_CLK_TCK")


def db_url_for(base_url: str, dbname: str) -> str:
    """Return ``base_url`` pointing at database ``dbname`` on the same server."""
    parts = urlsplit(base_url)
    if parts.scheme in ("postgresql", "postgres"):
        url = f"{parts.scheme}://{parts.netloc}/{quote(dbname, safe='')}"
        return f"{url}?{parts.query}" if parts.query else url
    return make_conninfo(base_url, dbname=dbname)


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What the table header says about the server."""

    version: str
    fsync: str
    synchronous_commit: str
    where: str


def cpu_of(pid: int, *, children: bool) -> float | None:
    """Return user+system seconds of ``pid`` (plus reaped children's), or None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is field 3 (state): utime=14, stime=15, cutime=16, cstime=17
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICK


def _ppid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class BenchServer:
    """Own the cluster (if embedded) and hand out fresh migrated databases."""

    def __init__(self, database_url: str | None, *, fsync: bool) -> None:
        self._embedded: EmbeddedPostgres | None = None
        if database_url is None:
            self._embedded = EmbeddedPostgres(fsync=fsync)
            self._embedded.start()
            database_url = self._embedded.url()
            # our own throwaway cluster on 127.0.0.1, plaintext like `jobsd dev`'s: the
            # bench, its worker processes and the peers' may connect without TLS
            os.environ.setdefault("JOBSD_ALLOW_INSECURE", "1")
        self.admin_url = database_url
        self.bindir = self._embedded.bindir if self._embedded is not None else None
        self._prefix = f"jobsd_bench_{os.getpid()}"
        self._template = f"{self._prefix}_tpl"
        self._made: list[str] = []
        self._seq = 0
        self.postmaster_pid: int | None = None

    def setup(self) -> ServerInfo:
        """Create and migrate the template; read the server's version and durability."""
        self._create(self._template, None)
        migrate_sync(db_url_for(self.admin_url, self._template))
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            if self._embedded is not None:
                # No timed checkpoint inside a case: its WAL figure is the steady cost,
                # without the full-page images a checkpoint falling into it would add.
                conn.execute("ALTER SYSTEM SET checkpoint_timeout = '1h'")
                conn.execute("ALTER SYSTEM SET max_wal_size = '8GB'")
                conn.execute("SELECT pg_reload_conf()")
            row = conn.execute(
                "SELECT current_setting('server_version'), current_setting('fsync'),"
                " current_setting('synchronous_commit'), pg_backend_pid()"
            ).fetchone()
            assert row is not None
            backend_ppid = _ppid_of(row[3])
        if backend_ppid is not None and cpu_of(backend_ppid, children=True) is not None:
            self.postmaster_pid = backend_ppid
        where = "embedded (throwaway cluster)" if self._embedded else "given --database-url"
        return ServerInfo(version=row[0], fsync=row[1], synchronous_commit=row[2], where=where)

    def cpu_s(self) -> float | None:
        """Return the CPU seconds Postgres has used so far (all its processes), or None."""
        pm = self.postmaster_pid
        if pm is None:
            return None
        total = cpu_of(pm, children=True)
        if total is None:
            return None
        for name in os.listdir("/proc"):
            if name.isdigit() and _ppid_of(int(name)) == pm:
                total += cpu_of(int(name), children=False) or 0.0
        return total

    @asynccontextmanager
    async def fresh_database(self, case: str, *, migrated: bool = True) -> AsyncIterator[str]:
        """Yield the URL of a new database (jobsd's schema in it unless not ``migrated``);
        drop it afterwards."""
        self._seq += 1
        name = f"{self._prefix}_{self._seq:02d}_{case}"
        self._create(name, self._template if migrated else None)
        try:
            yield db_url_for(self.admin_url, name)
        finally:
            self._drop(name)

    def wal_lsn(self) -> int:
        """Return the current WAL insert position in bytes (cluster-wide)."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])

    def cleanup(self) -> None:
        """Drop every database made here; stop and remove the embedded cluster."""
        try:
            if self._embedded is None:
                for name in reversed(self._made):
                    self._drop(name)
        finally:
            if self._embedded is not None:
                self._embedded.cleanup()

    def _create(self, name: str, template: str | None) -> None:
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            stmt += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(stmt)
        self._made.append(name)

    def _drop(self, name: str) -> None:
        stmt = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        for attempt in range(3):
            try:
                with psycopg.connect(self.admin_url, autocommit=True) as conn:
                    conn.execute(stmt)
                break
            except psycopg.OperationalError:
                if attempt == 2:
                    raise
                time.sleep(0.2)
        if name in self._made:
            self._made.remove(name)
