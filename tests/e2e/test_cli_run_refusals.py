"""``jobsd run`` refuses a bad setting before it starts anything, in one line.

The HTTP API's settings (its database URL, its address) are checked with the
daemon's, before the daemon registers, opens a pool or starts a handler process: a
refusal is the only line on stderr, never a traceback after ``daemon.starting``.

The daemon reaches the test database over its unix socket, so the TLS policy applies
without ``JOBSD_ALLOW_INSECURE`` (which would turn the refusal into a warning).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from jobsd.dev.embedded import EmbeddedPostgres

from .conftest import Proc, make_env, run_cli, scalar

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

REFUSED_WITHIN_S = 10.0
INSECURE_WARNING = "WARNING security.insecure_connection_allowed"
PLAINTEXT_REMOTE = "postgresql://u@db.example.com/x?sslmode=disable"


def socket_url(cluster: EmbeddedPostgres, db_url: str) -> str:
    """Return ``db_url`` over the cluster's unix socket: local, so TLS is not asked for."""
    return make_conninfo(db_url, host=str(cluster.base_dir / "sock"), port=str(cluster.port))


@pytest.fixture
def strict_env(pg_cluster: EmbeddedPostgres | None, db_url: str) -> dict[str, str]:
    """The daemon's environment on the test database, without JOBSD_ALLOW_INSECURE."""
    if pg_cluster is None:
        pytest.skip("an external test server (JOBSD_TEST_DATABASE_URL) is reached over TCP")
    env = make_env(socket_url(pg_cluster, db_url))
    env.pop("JOBSD_ALLOW_INSECURE")
    return env


@pytest.fixture
def busy_port() -> Iterator[int]:
    """Yield a port of 127.0.0.1 that something listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        yield int(holder.getsockname()[1])


def refusal_line(result: subprocess.CompletedProcess[str]) -> str:
    """Check a refusal: non-zero exit, one ``jobsd: error:`` line on stderr, nothing else."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    # against an external server, JOBSD_ALLOW_INSECURE's warning is a log line, not the error
    lines = [line for line in lines if not line.startswith(INSECURE_WARNING)]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    assert lines[0].startswith("jobsd: error: "), lines[0]
    assert result.stdout == ""
    return lines[0]


def run_refused(env: dict[str, str], conn: psycopg.Connection[Any], *settings: str) -> str:
    """Run ``jobsd run``; check that it refused at once, naming ``settings``, and that
    no worker registered; return the error line."""
    started = time.monotonic()
    result = run_cli("run", env=env, timeout_s=REFUSED_WITHIN_S + 20)
    took_s = time.monotonic() - started
    line = refusal_line(result)
    for setting in settings:
        assert setting in line, line
    assert took_s < REFUSED_WITHIN_S, f"refused after {took_s:.1f} s: {line}"
    assert scalar(conn, "SELECT count(*) FROM jobsd.workers") == 0, "a worker registered"
    return line


def test_a_plaintext_remote_api_database_url_is_refused_before_the_start(
    strict_env: dict[str, str], conn: psycopg.Connection[Any]
) -> None:
    env = strict_env | {
        "JOBSD_HTTP_ADDR": "127.0.0.1:0",
        "JOBSD_API_DATABASE_URL": PLAINTEXT_REMOTE,
    }
    line = run_refused(env, conn, "JOBSD_API_DATABASE_URL", "db.example.com", "sslmode=disable")
    assert "JOBSD_ALLOW_INSECURE" in line, "says what to do"


def test_the_api_database_url_is_not_checked_without_the_api(
    strict_env: dict[str, str], conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    """Without JOBSD_HTTP_ADDR no API starts: its URL is not the daemon's business."""
    daemon = spawn("run", env=strict_env | {"JOBSD_API_DATABASE_URL": PLAINTEXT_REMOTE})
    daemon.wait_ready()
    assert scalar(conn, "SELECT count(*) FROM jobsd.workers") == 1
    daemon.send(signal.SIGTERM)
    assert daemon.wait(20) == 0


@pytest.mark.parametrize(
    ("setting", "value", "fragments"),
    [
        ("JOBSD_API_DATABASE_URL", "host=db.example.com sslmode=sometimes", ["sslmode"]),
        ("JOBSD_HTTP_ADDR", "no-such-host.invalid:8080", ["no-such-host.invalid"]),
        ("JOBSD_HTTP_ADDR", "127.0.0.1:{busy_port}", ["127.0.0.1:{busy_port}", "in use"]),
        ("JOBSD_HTTP_ADDR", "not an address", ["host:port"]),
        ("JOBSD_UI_SECRET", "short", ["16 characters"]),
    ],
    ids=["api-url-bad-sslmode", "addr-unresolvable", "addr-in-use", "addr-malformed", "ui-secret"],
)
def test_a_bad_api_setting_is_refused_before_the_start(
    strict_env: dict[str, str],
    conn: psycopg.Connection[Any],
    busy_port: int,
    setting: str,
    value: str,
    fragments: list[str],
) -> None:
    env = strict_env | {"JOBSD_HTTP_ADDR": "127.0.0.1:0"}
    env[setting] = value.format(busy_port=busy_port)
    run_refused(env, conn, setting, *(f.format(busy_port=busy_port) for f in fragments))


def test_jobsd_api_refuses_the_same_way(strict_env: dict[str, str], busy_port: int) -> None:
    """``jobsd api`` shares the check: the same settings, the same lines."""
    for settings, fragment in (
        ({"JOBSD_API_DATABASE_URL": PLAINTEXT_REMOTE}, "JOBSD_API_DATABASE_URL"),
        ({"JOBSD_HTTP_ADDR": f"127.0.0.1:{busy_port}"}, "JOBSD_HTTP_ADDR"),
        ({"JOBSD_HTTP_ADDR": "no-such-host.invalid:8080"}, "JOBSD_HTTP_ADDR"),
    ):
        env = strict_env | {"JOBSD_HTTP_ADDR": "127.0.0.1:0"} | settings
        result = run_cli("api", env=env, timeout_s=REFUSED_WITHIN_S + 20)
        assert fragment in refusal_line(result)


def test_the_same_daemon_with_good_settings_starts_and_registers(
    db_url: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    """The control: what the refusals leave out (the API, a registration) does happen."""
    env = make_env(db_url, JOBSD_HTTP_ADDR="127.0.0.1:0")
    assert env.get("JOBSD_ALLOW_INSECURE") == "1"  # the API's role check warns only
    daemon = spawn("run", env=env)
    daemon.wait_ready()
    daemon.wait_for(r"\bapi\.listening\b")
    assert scalar(conn, "SELECT count(*) FROM jobsd.workers") == 1
    daemon.send(signal.SIGTERM)
    assert daemon.wait(20) == 0
