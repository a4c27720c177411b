"""Tests of jobsd.dev.embedded against real throwaway Postgres clusters."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.processes import pid_alive

from jobsd.dev import embedded
from jobsd.dev.embedded import EmbeddedPostgres, find_bindir
from jobsd.errors import ConfigError

MakeCluster = Callable[..., EmbeddedPostgres]
REPO_ROOT = Path(__file__).resolve().parents[1]


def _connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(url, autocommit=True, connect_timeout=5)


def _scalar(url: str, query: str) -> object:
    with _connect(url) as c:
        row = c.execute(query).fetchone()
    assert row is not None
    return row[0]


def test_start_connects_and_answers_select_one(make_cluster: MakeCluster) -> None:
    pg = make_cluster()
    assert pg.running
    assert pg.url("x") == f"postgresql://postgres@127.0.0.1:{pg.port}/x"
    with _connect(pg.url()) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
        settings: dict[str, str] = dict(
            c.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (["port", "listen_addresses", "unix_socket_directories", "fsync"],),
            ).fetchall()
        )
    assert settings["port"] == str(pg.port)
    assert settings["listen_addresses"] == "127.0.0.1"
    assert Path(settings["unix_socket_directories"]).parent == pg.data_dir.parent
    assert settings["fsync"] == "off"
    # The unix socket inside the temp dir works too.
    sock_url = f"host={settings['unix_socket_directories']} port={pg.port} user=postgres"
    assert _scalar(sock_url, "SELECT 2") == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="only root has to drop privileges")
def test_as_root_postgres_runs_as_unprivileged_user(make_cluster: MakeCluster) -> None:
    pg = make_cluster()
    pid = pg.postmaster_pid()
    assert pid is not None
    uid_line = next(
        line
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("Uid:")
    )
    assert int(uid_line.split()[1]) != 0
    assert pg.data_dir.stat().st_uid != 0


def test_restart_keeps_data_and_port(make_cluster: MakeCluster) -> None:
    pg = make_cluster()
    port = pg.port
    with _connect(pg.url()) as c:
        c.execute("CREATE TABLE t (x int)")
        c.execute("INSERT INTO t VALUES (42)")
    pg.restart()
    assert pg.running
    assert pg.port == port
    assert _scalar(pg.url(), "SELECT sum(x) FROM t") == 42
    assert _scalar(pg.url(), "SHOW port") == str(port)


def test_stop_waits_and_start_again(make_cluster: MakeCluster) -> None:
    pg = make_cluster()
    pg.stop("smart")
    assert not pg.running
    assert not (pg.data_dir / "postmaster.pid").exists()
    with pytest.raises(psycopg.OperationalError):
        _connect(pg.url())
    pg.stop()  # stopping a stopped cluster is a no-op
    pg.start()
    assert _scalar(pg.url(), "SELECT 1") == 1
    pg.stop("immediate")
    assert not pg.running
    with pytest.raises(ValueError, match="stop mode"):
        pg.stop("sideways")


def test_kill_breaks_connections_and_start_recovers_committed_data(
    make_cluster: MakeCluster,
) -> None:
    pg = make_cluster()
    port = pg.port
    pid = pg.postmaster_pid()
    assert pid is not None
    live = _connect(pg.url())
    live.execute("CREATE TABLE t (x int)")
    live.execute("INSERT INTO t SELECT generate_series(1, 1000)")

    pg.kill()

    assert not pg.running
    assert not pid_alive(pid)
    with pytest.raises(psycopg.OperationalError):
        live.execute("SELECT 1")
    live.close()
    with pytest.raises(psycopg.OperationalError):
        _connect(pg.url())

    log_size = pg.log_file.stat().st_size
    pg.start()
    assert pg.port == port
    assert _scalar(pg.url(), "SELECT count(*) FROM t") == 1000
    # It really was a crash: the new postmaster ran crash recovery.
    log_after = pg.log_file.read_text()[log_size:]
    assert "not properly shut down" in log_after


@pytest.mark.skipif(not Path("/proc/sysvipc/shm").exists(), reason="needs Linux /proc/sysvipc")
def test_kill_then_cleanup_leaks_no_shared_memory(make_cluster: MakeCluster) -> None:
    pg = make_cluster()
    shmid = (pg.data_dir / "postmaster.pid").read_text().split("\n")[6].split()[1]

    def shmids() -> set[str]:
        rows = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
        return {row.split()[1] for row in rows}

    assert shmid in shmids()
    pg.kill()
    pg.cleanup()
    assert shmid not in shmids()


def test_cleanup_removes_directory_and_is_idempotent(make_cluster: MakeCluster) -> None:
    pg = make_cluster()
    base = pg.data_dir.parent
    pid = pg.postmaster_pid()
    assert pid is not None and base.is_dir()
    pg.cleanup()
    assert not base.exists()
    assert not pg.running
    assert not pid_alive(pid)
    pg.cleanup()  # idempotent
    assert not base.exists()
    with pytest.raises(ConfigError, match="cleaned up"):
        pg.start()


def test_context_manager_starts_and_cleans_up() -> None:
    with EmbeddedPostgres() as pg:
        base = pg.data_dir.parent
        assert _scalar(pg.url(), "SELECT 3") == 3
    assert not base.exists()
    assert not pg.running


def test_extra_conf_is_applied_and_hba_lines_replace_pg_hba(make_cluster: MakeCluster) -> None:
    pg = make_cluster(
        extra_conf={"work_mem": "7MB", "application_name": "it's embedded"},
        hba_lines=[
            "local all all trust",
            "host all all 127.0.0.1/32 reject",
        ],
    )
    with pytest.raises(psycopg.OperationalError, match=r"pg_hba\.conf rejects"):
        _connect(pg.url())
    sock_url = f"host={pg.data_dir.parent / 'sock'} port={pg.port} user=postgres"
    assert _scalar(sock_url, "SHOW work_mem") == "7MB"
    assert _scalar(sock_url, "SELECT current_setting('application_name')") == "it's embedded"


def test_busy_explicit_port_gives_config_error_with_log_tail() -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy = blocker.getsockname()[1]
        pg = EmbeddedPostgres(port=busy)
        try:
            with pytest.raises(ConfigError) as info:
                pg.start()
            assert f"127.0.0.1:{busy}" in str(info.value)
            assert "could not bind" in str(info.value)
            assert not pg.running
        finally:
            pg.cleanup()


def test_auto_port_moves_on_after_a_clash(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy = blocker.getsockname()[1]
        real_free_port = embedded._free_port
        ports = iter([busy])
        # The first port handed out is taken, as if another process grabbed it in between.
        monkeypatch.setattr(embedded, "_free_port", lambda: next(ports, None) or real_free_port())
        pg = make_cluster()
        assert pg.port != busy
        assert _scalar(pg.url(), "SHOW port") == str(pg.port)


def test_find_bindir_returns_directory_with_binaries() -> None:
    bindir = find_bindir()
    for name in ("initdb", "pg_ctl", "postgres"):
        assert (bindir / name).is_file()
        assert os.access(bindir / name, os.X_OK)


def test_bindir_env_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    real = find_bindir()
    monkeypatch.setenv("JOBSD_PG_BINDIR", str(real))
    assert find_bindir() == real


def test_bogus_bindir_env_gives_clear_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bogus = tmp_path / "no-postgres-here"
    monkeypatch.setenv("JOBSD_PG_BINDIR", str(bogus))
    with pytest.raises(ConfigError) as info:
        find_bindir()
    message = str(info.value)
    assert "JOBSD_PG_BINDIR" in message
    assert str(bogus) in message
    assert "initdb" in message
    assert "\n" not in message
    with pytest.raises(ConfigError):
        EmbeddedPostgres()


def _run_child(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_atexit_cleans_up_a_cluster_left_running() -> None:
    result = _run_child(
        """
        from jobsd.dev.embedded import EmbeddedPostgres
        pg = EmbeddedPostgres()
        pg.start()
        print(pg.postmaster_pid(), pg.data_dir.parent, flush=True)
        # exit without cleanup()
        """
    )
    assert result.returncode == 0, result.stderr
    pid_text, base = result.stdout.split()
    assert not pid_alive(int(pid_text))
    assert not Path(base).exists()


def test_clusters_of_a_killed_process_are_reaped(shared_tmp: Path) -> None:
    result = _run_child(
        f"""
        import os, signal
        from pathlib import Path
        from jobsd.dev.embedded import EmbeddedPostgres
        pg = EmbeddedPostgres(base_dir=Path({str(shared_tmp)!r}))
        pg.start()
        print(pg.postmaster_pid(), pg.data_dir.parent, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # no atexit
        """
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    pid_text, base = result.stdout.split()
    pid = int(pid_text)
    try:
        assert pid_alive(pid)
        assert Path(base).is_dir()
        fresh = EmbeddedPostgres(base_dir=shared_tmp)
        fresh.cleanup()
        assert not pid_alive(pid)
        assert not Path(base).exists()
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
