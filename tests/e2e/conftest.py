"""Fixtures of the end-to-end tests: ``jobsd`` subprocesses, their output, and polling.

Daemons run as ``python -m jobsd run`` with the handlers of ``e2e_handlers.py`` and
short intervals; tests talk to them only through the database, the command line and
signals. Every process a test starts is killed at teardown if it is still alive.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from support.proc import Proc as Proc
from support.waiting import poll as poll
from support.waiting import wait_status as wait_status

T = TypeVar("T")

E2E_DIR = Path(__file__).resolve().parent
LOG_TAIL_CHARS = 6000  # of each daemon's stderr, printed at teardown
REPO_ROOT = E2E_DIR.parents[1]

# fast daemons: the tests finish in seconds
DAEMON_ENV = {
    "JOBSD_HANDLERS": "e2e_handlers",
    "JOBSD_SLOTS": "4",
    "JOBSD_POLL_INTERVAL": "0.5",
    "JOBSD_HEARTBEAT_INTERVAL": "0.5",
    "JOBSD_PROGRESS_INTERVAL": "0.1",
    "JOBSD_DRAIN_TIMEOUT": "10",
    # ended jobs stay in the hot table, where a test's own SQL looks for them
    "JOBSD_ARCHIVE_AFTER": "1h",
    "JOBSD_LOG_LEVEL": "INFO",
    "JOBSD_ALLOW_INSECURE": "1",  # the test server listens on plain TCP (127.0.0.1)
}


def jobsd_command() -> list[str]:
    """Return the installed ``jobsd`` script, or ``python -m jobsd`` without one."""
    script = Path(sys.executable).parent / "jobsd"
    return [str(script)] if script.exists() else [sys.executable, "-m", "jobsd"]


def make_env(database_url: str | None, **settings: str) -> dict[str, str]:
    """Return a clean environment: no inherited JOBSD_*, fast daemon settings, the e2e
    handlers importable; ``settings`` (``JOBSD_*=value``) override the defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSD_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(E2E_DIR), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if database_url is not None:
        env["JOBSD_DATABASE_URL"] = database_url
    env.update(DAEMON_ENV)
    env.update(settings)
    return env


def scalar(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    """Run a query and return the first column of its first row."""
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def job_status(conn: psycopg.Connection[Any], job_id: object) -> str:
    """Return a job's status."""
    return str(scalar(conn, "SELECT status FROM jobsd.jobs WHERE id = %s", (job_id,)))


SIDE_TABLES = """
CREATE TABLE IF NOT EXISTS e2e_side (
  job_id uuid PRIMARY KEY, attempt int NOT NULL, pid int NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS e2e_batches (
  first_row int PRIMARY KEY, job_id uuid NOT NULL, attempt int NOT NULL,
  redone int NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS e2e_runs (
  job_id uuid NOT NULL, attempt int NOT NULL, pid int NOT NULL,
  PRIMARY KEY (job_id, attempt));
"""


def create_side_tables(url: str) -> None:
    """Create the tables the e2e handlers write their side effects to."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SIDE_TABLES)


@pytest.fixture
def side_db(db_url: str) -> str:
    """Return the test's database URL, with the handlers' side tables created."""
    create_side_tables(db_url)
    return db_url


@pytest.fixture
def spawn() -> Iterator[Callable[..., Proc]]:
    """Yield a factory of ``jobsd`` subprocesses: ``spawn("run", env=...)``.

    At teardown, processes still alive are killed; the output of each is printed (pytest
    shows it for failed tests).
    """
    procs: list[Proc] = []

    def factory(*args: str, env: dict[str, str]) -> Proc:
        proc = Proc([*jobsd_command(), *args], env)
        procs.append(proc)
        return proc

    yield factory
    for proc in procs:
        proc.kill()
        print(f"--- {' '.join(proc.args[-2:])} pid {proc.pid} exit {proc.popen.returncode}")
        print(proc.text("stderr")[-LOG_TAIL_CHARS:])


def run_cli(
    *args: str, env: dict[str, str], timeout_s: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run one ``jobsd`` command to its end and return its result."""
    return subprocess.run(
        [*jobsd_command(), *args],
        env=env,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
