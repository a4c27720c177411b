"""``jobsd top`` under a pseudo-terminal: what it draws, that it redraws, and Ctrl-C."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time

import psycopg
import pytest
from psycopg import sql
from support.jobs import make_job

from .conftest import REPO_ROOT, make_env

pytestmark = pytest.mark.timeout(60)

_ANSI = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|[()][0-9A-Za-z]|[=>])")


class Terminal:
    """A command on the child side of a pty, 120 x 40, its screen output read as text."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its controlling terminal
            os.chdir(REPO_ROOT)
            # as a person's shell starts it: a run started in the background of a script
            # (`.ci/run &`) ignores SIGINT, which the command would inherit, and Ctrl-C
            # would do nothing
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execvpe(args[0], args, env)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.raw = b""
        self.status: int | None = None

    def text(self) -> str:
        return _ANSI.sub("", self.raw.decode("utf-8", "replace")).replace("\r", "")

    def read(self, timeout_s: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if ready:
            with contextlib.suppress(OSError):  # EIO: the child is gone
                self.raw += os.read(self.fd, 65536)

    def wait_for(self, pattern: str, *, since: int = 0, timeout_s: float = 20.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            match = re.compile(pattern, re.M).search(self.text(), since)
            if match:
                return match
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} on screen:\n{self.text()[-3000:]}")
            self.read(0.1)

    def wait_exit(self, timeout_s: float = 10.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
                return os.waitstatus_to_exitcode(status)
            self.read(0.05)
        raise AssertionError(f"jobsd top still running:\n{self.text()[-2000:]}")

    def close(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.fd)


def test_top_draws_queues_daemons_and_failures_and_redraws_until_ctrl_c(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobsd.queues (name, paused_at) VALUES ('reports', now())")
        make_jobs_for_screen(conn)
    env = make_env(db_url, JOBSD_ALLOW_INSECURE="1", TERM="xterm-256color")
    term = Terminal([sys.executable, "-m", "jobsd", "top", "--interval", "200ms"], env)
    try:
        term.wait_for(r"jobsd top .*Ctrl-C to quit")
        term.wait_for(r"^default\s+2\s+0\s+0\s+1\s+0\s+0\s+1\s")
        term.wait_for(r"^reports\s+0\s+0\s+0\s+0\s+0\s+0\s+0\s+-\s+paused")
        term.wait_for(r"last 20 min")  # 120 columns: the chart is drawn
        term.wait_for(r"\(no daemon registered\)")
        term.wait_for(r"import_csv\s+default\s+acme\s+\S+ ago\s+OSError: disk full on /var")

        # a change in the database shows on a later redraw, without a key pressed
        mark = len(term.text())
        with psycopg.connect(db_url, autocommit=True) as conn:
            make_job(conn, queue="reports", org_id="acme")
        term.wait_for(r"^reports\s+1\s", since=mark)

        os.write(term.fd, b"\x03")  # Ctrl-C, through the terminal
        assert term.wait_exit() == 0
        assert "Traceback" not in term.text()
    finally:
        term.close()


def make_jobs_for_screen(conn: psycopg.Connection[object]) -> None:
    make_job(conn, org_id="acme")
    make_job(conn, org_id="globex")
    claim = {"attempts": sql.SQL("attempts + 1"), "worker_id": "w-gone"}
    make_job(conn, org_id="acme", status="running", claim=claim)
    make_job(
        conn,
        org_id="acme",
        type="import_csv",
        status="failed",
        claim=claim,
        error="OSError: disk full on /var",
        finished_at=sql.SQL("now()"),
    )


def test_top_says_when_the_database_is_unavailable_and_keeps_trying() -> None:
    env = make_env(
        "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1", JOBSD_ALLOW_INSECURE="1"
    )
    term = Terminal([sys.executable, "-m", "jobsd", "top", "--interval", "200ms"], env)
    try:
        first = term.wait_for(r"database unavailable: [\s\S]*?refused[\s\S]*?\(retrying\)")
        term.wait_for(r"database unavailable: ", since=first.end())  # and again
        os.write(term.fd, b"\x03")
        assert term.wait_exit() == 0
    finally:
        term.close()


def test_top_once_fails_without_a_database_and_refuses_a_bad_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner

    from jobsd.cli.app import main

    monkeypatch.setenv("JOBSD_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "1")
    once = CliRunner().invoke(main, ["top", "--once"])
    assert once.exit_code == 1 and "database unavailable" in once.output
    bad = CliRunner().invoke(main, ["top", "--interval", "soon"])
    assert bad.exit_code == 2 and "not a duration: 'soon'" in bad.output
    assert CliRunner().invoke(main, ["top", "--interval", "0"]).exit_code == 2
