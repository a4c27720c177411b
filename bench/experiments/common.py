"""Shared bits of the experiment scripts: a scratch database per variant, CPU readings.

Experiments run on a given server (``--database-url``, default the machine's Postgres
on 127.0.0.1:5432) in databases named ``jobsd_exp_<pid>_*``, dropped at the end. They
are scratch: their SQL is what is being tried, not what jobsd ships.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server import db_url_for

from jobsd.store.migrate import migrate_sync

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PREFIX = f"jobsd_exp_{os.getpid()}"


class Scratch:
    """A migrated template and per-variant clones on one server."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.template = f"{PREFIX}_tpl"
        self.made: list[str] = []
        self._exec(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        self.made.append(self.template)
        migrate_sync(db_url_for(admin_url, self.template))

    def _exec(self, stmt: Any) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(stmt)

    def clone(self, name: str, ddl: str = "", *, empty: bool = False) -> str:
        """Create ``<prefix>_<name>`` from the template (or empty), run ``ddl`` in it."""
        db = f"{PREFIX}_{name}"
        self._exec(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db))
        if not empty:
            stmt += sql.SQL(" TEMPLATE {}").format(sql.Identifier(self.template))
        self._exec(stmt)
        self.made.append(db)
        url = db_url_for(self.admin_url, db)
        if ddl:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(ddl)  # type: ignore[arg-type]
        return url

    def drop(self, url: str) -> None:
        db = url.rsplit("/", 1)[1]
        self._exec(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
        if db in self.made:
            self.made.remove(db)

    def cleanup(self) -> None:
        for db in reversed(self.made):
            self._exec(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db))
            )
        self.made.clear()


@contextmanager
def scratch(admin_url: str) -> Iterator[Scratch]:
    s = Scratch(admin_url)
    try:
        yield s
    finally:
        s.cleanup()


def run_on_scratch(name: str, run: Callable[..., Awaitable[None]], **options: int) -> None:
    """The main of a scratch script: read ``--database-url`` and an integer flag per
    ``options`` (name=default), then ``anyio.run(run, url, *values)`` on a fresh clone."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=DEFAULT_URL)
    for option, default in options.items():
        parser.add_argument(f"--{option}", type=int, default=default)
    args = parser.parse_args()
    with scratch(args.database_url) as s:
        anyio.run(run, s.clone(name), *(getattr(args, option) for option in options))


def backend_cpu(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> float:
    """CPU seconds of the connection's backend so far (it runs on this machine)."""
    return pids_cpu(conn.info.backend_pid)


def pids_cpu(*pids: int) -> float:
    """CPU seconds of these processes so far (backends of this machine's server).

    From /proc/<pid>/schedstat (the scheduler's nanoseconds on CPU), not the tick-
    sampled utime/stime, which over a second of short round trips is off by 10 %.
    """
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/schedstat") as fh:
            total += int(fh.read().split()[0])
    return total / 1e9


def lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def process_cpu() -> float:
    return time.process_time()


def median(xs: list[float]) -> float:
    return statistics.median(xs)
