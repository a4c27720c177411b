"""A throwaway Postgres cluster for ``jobsd dev`` and the test suite.

``EmbeddedPostgres`` runs ``initdb`` in a fresh temporary directory, starts a postmaster
that listens on 127.0.0.1 only (on a port chosen at run time) with its unix socket inside
that directory, and removes everything again on ``cleanup()``. Every instance that has not
been cleaned up is cleaned up at interpreter exit.

As root, Postgres refuses to run, so the cluster runs as an unprivileged OS user
(``jobsd-pg``, created on first use; else ``postgres``; else ``nobody``): initdb and the
postmaster are started with ``subprocess``'s ``user``/``group`` arguments, so the postmaster
is a direct child of this process. It is started directly rather than via ``pg_ctl`` for
the same reason: we can reap it, so it leaves no zombie in containers whose init does not.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

from jobsd.errors import ConfigError

__all__ = ["EmbeddedPostgres", "find_bindir"]

log = logging.getLogger(__name__)

BINDIR_ENV = "JOBSD_PG_BINDIR"
SUPERUSER = "postgres"
OS_USER = "jobsd-pg"
_REQUIRED_BINARIES = ("initdb", "pg_ctl", "postgres")
_NO_BINARIES = "no Postgres binaries found: install postgresql or `pip install jobsd[embedded]`"
_DIR_PREFIX = "jobsd-pg-"
_OWNER_FILE = "owner.pid"
# pg_ctl's shutdown modes and the signals it sends for them.
_STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}
_START_TIMEOUT_S = 60
_STOP_TIMEOUT_S = 60
_KILL_TIMEOUT_S = 10.0
_PORT_ATTEMPTS = 5
_LOG_TAIL_LINES = 30
# sun_path is 108 bytes on Linux (104 on macOS); keep a margin for the NUL byte.
_MAX_SOCKET_PATH = 103
_IPC_RMID = 0
_PORT_CLASH = re.compile(r"could not bind IPv[46] address|Address already in use")


def _has_binaries(directory: Path) -> bool:
    """Tell whether a directory holds executable initdb, pg_ctl and postgres."""
    return all(
        (directory / name).is_file() and os.access(directory / name, os.X_OK)
        for name in _REQUIRED_BINARIES
    )


def _version_key(path: Path) -> tuple[int, ...]:
    """Turn /usr/lib/postgresql/<version>/bin into a sortable version tuple."""
    parts = re.findall(r"\d+", path.parent.name)
    return tuple(int(p) for p in parts) if parts else (-1,)


def _pg_config_bindir() -> Path | None:
    """Ask ``pg_config`` on PATH for its bindir."""
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    try:
        out = subprocess.run(
            [pg_config, "--bindir"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out) if out else None


def _pgserver_bindir() -> Path | None:
    """Locate the bin dir bundled in the optional ``pgserver`` wheel without importing it."""
    try:
        spec = importlib.util.find_spec("pgserver")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "pginstall" / "bin"
        if _has_binaries(candidate):
            return candidate
    return None


def find_bindir() -> Path:
    """Locate a directory with initdb, pg_ctl and postgres.

    Order: ``$JOBSD_PG_BINDIR`` (an error if set but wrong); ``pg_config --bindir``;
    ``initdb`` on PATH (symlinks resolved); the newest ``/usr/lib/postgresql/*/bin``;
    the bin dir bundled in the optional ``pgserver`` wheel.
    """
    env = os.environ.get(BINDIR_ENV, "").strip()
    if env:
        path = Path(env).expanduser()
        if not _has_binaries(path):
            raise ConfigError(
                f"{BINDIR_ENV}={env} does not contain executable {', '.join(_REQUIRED_BINARIES)}"
            )
        return path

    candidates: list[Path] = []
    pg_config_bindir = _pg_config_bindir()
    if pg_config_bindir is not None:
        candidates.append(pg_config_bindir)
    initdb = shutil.which("initdb")
    if initdb is not None:
        candidates.append(Path(initdb).resolve().parent)
    candidates.extend(
        sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    )
    for candidate in candidates:
        if _has_binaries(candidate):
            return candidate

    bundled = _pgserver_bindir()
    if bundled is not None:
        return bundled
    raise ConfigError(_NO_BINARIES)


def _free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _proc_stat_fields(pid: int) -> list[str] | None:
    """Return the fields of /proc/PID/stat after the command name, or None if unreadable."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[-1].split()


def _pid_alive(pid: int) -> bool:
    """Tell whether a process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if not Path("/proc").is_dir():
        return True
    fields = _proc_stat_fields(pid)
    if fields is None:
        return False
    return fields[0] not in ("Z", "X")


def _child_pids(ppid: int) -> list[int]:
    """List the direct children of a process."""
    children: list[int] = []
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            fields = _proc_stat_fields(int(entry.name))
            if fields is not None and len(fields) > 1 and fields[1] == str(ppid):
                children.append(int(entry.name))
        return children
    try:
        out = subprocess.run(
            ["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return children
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == str(ppid):
            children.append(int(parts[0]))
    return children


def _remove_sysv_segment(shmid: int) -> None:
    """Mark a SysV shared memory segment for removal (best effort)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmctl(ctypes.c_int(shmid), ctypes.c_int(_IPC_RMID), None)
    except (OSError, AttributeError):
        pass


def _tail(path: Path, offset: int = 0, lines: int = _LOG_TAIL_LINES) -> str:
    """Return the last lines of a file from a byte offset on ('' if missing)."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace").rstrip()
    return "\n".join(text.splitlines()[-lines:])


def _quote_conf(value: str) -> str:
    """Quote a postgresql.conf value unless it is already single-quoted."""
    if len(value) >= 2 and value.startswith("'") and value.endswith("'"):
        return value
    return "'" + value.replace("'", "''") + "'"


_user_lock = threading.Lock()
_cached_user: pwd.struct_passwd | None = None


def _ensure_os_user() -> pwd.struct_passwd:
    """Return an unprivileged OS user to run Postgres as root, creating ``jobsd-pg``."""
    global _cached_user
    with _user_lock:
        if _cached_user is not None:
            return _cached_user
        try:
            _cached_user = pwd.getpwnam(OS_USER)
            return _cached_user
        except KeyError:
            pass
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        nologin = "/usr/sbin/nologin" if Path("/usr/sbin/nologin").exists() else "/bin/false"
        try:
            result = subprocess.run(
                [useradd, "--system", "--no-create-home", "--shell", nologin, OS_USER],
                capture_output=True,
                text=True,
                timeout=30,
            )
            detail = result.stderr.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            detail = str(exc)
        try:
            # Also covers a concurrent process that created the user first.
            _cached_user = pwd.getpwnam(OS_USER)
            log.info("embedded.os_user_created", extra={"os_user": OS_USER})
            return _cached_user
        except KeyError:
            log.warning("embedded.useradd_failed", extra={"os_user": OS_USER, "detail": detail})
        for fallback in ("postgres", "nobody"):
            try:
                _cached_user = pwd.getpwnam(fallback)
                return _cached_user
            except KeyError:
                continue
        raise ConfigError(
            f"running as root and no unprivileged OS user for Postgres: "
            f"useradd {OS_USER} failed ({detail}) and neither postgres nor nobody exists"
        )


def _untraversable(path: Path, user: pwd.struct_passwd) -> Path | None:
    """Return the first directory on the way to ``path`` that ``user`` cannot enter."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    current = Path(path.anchor)
    for part in path.parts[1:]:
        current = current / part
        try:
            st = current.stat()
        except OSError:
            return current
        if not stat.S_ISDIR(st.st_mode):
            break
        if st.st_uid == user.pw_uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid in groups:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            return current
    return None


_live: set[EmbeddedPostgres] = set()


def _cleanup_all() -> None:
    """Clean up every cluster still alive at interpreter exit."""
    for cluster in list(_live):
        try:
            cluster.cleanup()
        except Exception:
            log.exception(
                "embedded.atexit_cleanup_failed", extra={"data_dir": str(cluster.data_dir)}
            )


atexit.register(_cleanup_all)


class EmbeddedPostgres:
    """Run a throwaway Postgres cluster in a temporary directory.

    ``base_dir`` is the parent of the temporary directory (default: the system temp dir);
    the temporary directory itself is always created fresh and removed by ``cleanup()``.
    """

    def __init__(
        self,
        *,
        base_dir: Path | None = None,
        port: int | None = None,
        fsync: bool = False,
        extra_conf: dict[str, str] | None = None,
        hba_lines: list[str] | None = None,
        bindir: Path | None = None,
        standby_of: str | None = None,
    ) -> None:
        """Prepare (but do not start) a cluster in a new temporary directory.

        With ``standby_of`` (a superuser URL of a running primary, with an
        ``application_name`` when the primary names its synchronous standbys) the data
        directory is a base backup of that primary instead of a new cluster, and the
        server starts as its streaming standby (``promote()`` makes it a primary).
        """
        if bindir is not None:
            bindir = Path(bindir)
            if not _has_binaries(bindir):
                raise ConfigError(
                    f"bindir {bindir} does not contain executable {', '.join(_REQUIRED_BINARIES)}"
                )
            self._bindir = bindir
        else:
            self._bindir = find_bindir()
        self._fsync = fsync
        self._standby_of = standby_of
        self._extra_conf = dict(extra_conf or {})
        self._hba_lines = list(hba_lines) if hba_lines is not None else None
        self._auto_port = port is None
        self._port = port if port is not None else _free_port()
        self._user = _ensure_os_user() if os.geteuid() == 0 else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._initialized = False
        self._ever_started = False
        self._cleaned = False

        parent = Path(base_dir) if base_dir is not None else Path(tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        _reap_stale(parent)
        self._base = Path(tempfile.mkdtemp(prefix=_DIR_PREFIX, dir=parent)).resolve()
        _live.add(self)
        try:
            (self._base / _OWNER_FILE).write_text(f"{os.getpid()}\n")
            self._sock_dir.mkdir()
            if self._user is not None:
                for path in (self._base, self._sock_dir):
                    os.chown(path, self._user.pw_uid, self._user.pw_gid)
                for path in (self._base, self._bindir / "postgres"):
                    blocked = _untraversable(path, self._user)
                    if blocked is not None:
                        raise ConfigError(
                            f"{blocked} is not accessible to OS user {self._user.pw_name}, "
                            f"which runs Postgres as root: use a base_dir/bindir under "
                            f"world-traversable directories such as /tmp"
                        )
            if len(str(self._sock_dir / ".s.PGSQL.65535")) > _MAX_SOCKET_PATH:
                raise ConfigError(
                    f"unix socket path under {self._sock_dir} is too long: use a shorter base_dir"
                )
        except BaseException:
            self.cleanup()
            raise

    # -- paths and state -------------------------------------------------------------------

    @property
    def port(self) -> int:
        """Return the TCP port on 127.0.0.1 (fixed once the cluster first started)."""
        return self._port

    @property
    def data_dir(self) -> Path:
        """Return the cluster's data directory (PGDATA)."""
        return self._base / "data"

    @property
    def base_dir(self) -> Path:
        """Return the temporary directory holding data dir, socket dir and log file."""
        return self._base

    @property
    def log_file(self) -> Path:
        """Return the path of the postmaster's log file."""
        return self._base / "postgres.log"

    @property
    def bindir(self) -> Path:
        """Return the directory of the Postgres binaries in use."""
        return self._bindir

    @property
    def _sock_dir(self) -> Path:
        return self._base / "sock"

    @property
    def _pid_file(self) -> Path:
        return self.data_dir / "postmaster.pid"

    def postmaster_pid(self) -> int | None:
        """Return the postmaster's pid if it is running, else None."""
        try:
            first = self._pid_file.read_text().split("\n", 1)[0].strip()
            pid = int(first)
        except (OSError, ValueError):
            return None
        return pid if _pid_alive(pid) else None

    @property
    def running(self) -> bool:
        """Tell whether the postmaster is alive."""
        return self.postmaster_pid() is not None

    def url(self, dbname: str = "postgres") -> str:
        """Return a libpq URL for the superuser on this cluster."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self._port}/{quote(dbname, safe='')}"

    # -- process helpers -------------------------------------------------------------------

    def _as_user(self) -> dict[str, Any]:
        """Return Popen arguments that drop to the unprivileged OS user when we are root.

        The process is our direct child (no ``runuser`` in between), so we reap it and it
        never stops along with a SIGSTOPped postmaster.
        """
        if self._user is None:
            return {}
        return {
            "user": self._user.pw_uid,
            "group": self._user.pw_gid,
            "extra_groups": os.getgrouplist(self._user.pw_name, self._user.pw_gid),
        }

    def _env(self) -> dict[str, str]:
        """Return the environment for Postgres processes, without the PG* variables."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.setdefault("LC_ALL", "C")
        return env

    def _bin(self, name: str) -> str:
        return str(self._bindir / name)

    def _run_tool(self, args: list[str], *, timeout_s: float, failed: str) -> None:
        """Run a Postgres tool as the cluster's OS user; ConfigError with its output's
        tail when it cannot run or fails."""
        try:
            result = subprocess.run(
                args,
                cwd=self._base,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout_s,
                check=False,
                **self._as_user(),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise ConfigError(f"cannot run {args[0]}: {exc}") from exc
        if result.returncode != 0:
            tail = "\n".join(result.stdout.strip().splitlines()[-_LOG_TAIL_LINES:])
            raise ConfigError(f"{failed} (exit {result.returncode}):\n{tail}")

    def _initdb(self) -> None:
        """Create the data directory and write the configuration."""
        t0 = time.monotonic()
        args = [
            self._bin("initdb"),
            "-D",
            str(self.data_dir),
            "-U",
            SUPERUSER,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
        ]
        if not self._fsync:
            args.append("--no-sync")
        self._run_tool(args, timeout_s=120, failed=f"initdb failed in {self.data_dir}")

        self._write_conf()
        self._initialized = True
        log.info(
            "embedded.initdb",
            extra={
                "data_dir": str(self.data_dir),
                "bindir": str(self._bindir),
                "os_user": self._user.pw_name if self._user else None,
                "elapsed_ms": round((time.monotonic() - t0) * 1000),
            },
        )

    def _write_conf(self) -> None:
        """Append jobsd's settings to postgresql.conf (later lines win) and write pg_hba."""
        conf: dict[str, str] = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self._sock_dir),
            "max_connections": "200",
            "logging_collector": "off",
            "log_line_prefix": "%m [%p] ",
        }
        if not self._fsync:
            # synchronous_commit stays on: with fsync off it costs one write() per commit,
            # and it keeps committed rows across kill() (WAL buffers die with the process).
            conf.update({"fsync": "off", "full_page_writes": "off"})
        conf.update(self._extra_conf)
        lines = ["", "# --- jobsd.dev.embedded ---"]
        lines += [f"{key} = {_quote_conf(value)}" for key, value in conf.items()]
        with (self.data_dir / "postgresql.conf").open("a") as fh:
            fh.write("\n".join(lines) + "\n")
        if self._hba_lines is not None:
            (self.data_dir / "pg_hba.conf").write_text("\n".join(self._hba_lines) + "\n")

    def _base_backup(self, primary_url: str) -> None:
        """Fill the data directory with a base backup of a running primary, set up to
        stream from it as a standby (``pg_basebackup -R``)."""
        t0 = time.monotonic()
        args = [
            self._bin("pg_basebackup"),
            "-D",
            str(self.data_dir),
            "-d",
            primary_url,
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        ]
        if not self._fsync:
            args.append("--no-sync")
        self._run_tool(args, timeout_s=300, failed="pg_basebackup failed")
        # the primary's pid file and socket settings came with the copy
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / "postmaster.pid").unlink()
        self._write_conf()
        self._initialized = True
        log.info(
            "embedded.base_backup",
            extra={
                "data_dir": str(self.data_dir),
                "elapsed_ms": round((time.monotonic() - t0) * 1000),
            },
        )

    def _remove_stale_locks(self) -> None:
        """Remove lock files of a postmaster that is known to be dead."""
        stale = [self._pid_file, *self._sock_dir.glob(".s.PGSQL.*.lock")]
        for path in stale:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _ready_pid(self) -> int | None:
        """Return the postmaster's pid once postmaster.pid says it accepts connections."""
        try:
            lines = self._pid_file.read_text().split("\n")
        except OSError:
            return None
        # Line 8 of postmaster.pid is the postmaster status (PG >= 10).
        if len(lines) < 8 or lines[7].strip() != "ready":
            return None
        try:
            pid = int(lines[0])
        except ValueError:
            return None
        return pid if _pid_alive(pid) else None

    def _shmid(self) -> int | None:
        """Return the SysV shared memory id recorded in postmaster.pid, if any."""
        try:
            lines = self._pid_file.read_text().split("\n")
            return int(lines[6].split()[1])
        except (OSError, IndexError, ValueError):
            return None

    def _reap(self, timeout: float) -> None:
        """Wait for our postmaster child process, so it leaves no zombie."""
        if self._proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=timeout)
        if self._proc.returncode is not None:
            self._proc = None

    def _wait_gone(self, pids: Sequence[int], timeout: float) -> bool:
        """Poll until no process in ``pids`` is alive; tell whether that happened in time."""
        deadline = time.monotonic() + timeout
        while any(_pid_alive(p) for p in pids):
            if self._proc is not None:
                self._proc.poll()  # reap a direct child as soon as it exits
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _spawn(self) -> tuple[bool, str]:
        """Start the postmaster once and wait until it is ready; return success and log lines."""
        offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        cmd = [self._bin("postgres"), "-D", str(self.data_dir), "-p", str(self._port)]
        with self.log_file.open("ab") as log_fh:
            try:
                proc = subprocess.Popen(
                    cmd,
                    cwd=self._base,
                    env=self._env(),
                    stdin=subprocess.DEVNULL,
                    stdout=log_fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # keep terminal signals (Ctrl-C) away from it
                    **self._as_user(),
                )
            except OSError as exc:
                raise ConfigError(f"cannot run postgres ({cmd[0]}): {exc}") from exc
        self._proc = proc
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if self._ready_pid() is not None:
                return True, ""
            if proc.poll() is not None:
                self._proc = None
                return False, _tail(self.log_file, offset)
            if time.monotonic() > deadline:
                return False, _tail(self.log_file, offset) + (
                    f"\n(not ready after {_START_TIMEOUT_S} s)"
                )
            time.sleep(0.01)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the cluster, running initdb first if needed; a no-op if it is running."""
        if self._cleaned:
            raise ConfigError(f"cluster in {self._base} was cleaned up: create a new one")
        if self.running:
            return
        t0 = time.monotonic()
        if not self._initialized:
            if self._standby_of is not None:
                self._base_backup(self._standby_of)
            else:
                self._initdb()
        self._remove_stale_locks()
        attempts = _PORT_ATTEMPTS if self._auto_port and not self._ever_started else 1
        for attempt in range(1, attempts + 1):
            ok, tail = self._spawn()
            if ok:
                self._ever_started = True
                log.info(
                    "embedded.started",
                    extra={
                        "port": self._port,
                        "pg_pid": self.postmaster_pid(),
                        "data_dir": str(self.data_dir),
                        "elapsed_ms": round((time.monotonic() - t0) * 1000),
                    },
                )
                return
            if self.running or self._proc is not None:  # timed out but still alive
                self.kill()
            if attempt < attempts and _PORT_CLASH.search(tail):
                old, self._port = self._port, _free_port()
                log.warning("embedded.port_clash", extra={"port": old, "new_port": self._port})
                continue
            raise ConfigError(
                f"postgres failed to start on 127.0.0.1:{self._port} "
                f"(data dir {self.data_dir}); log tail:\n{tail}"
            )

    def stop(self, mode: str = "fast") -> None:
        """Stop the cluster (shutdown mode smart, fast or immediate) and wait until it is gone."""
        if mode not in _STOP_SIGNALS:
            raise ValueError(f"stop mode must be one of {', '.join(_STOP_SIGNALS)}, not {mode!r}")
        pid = self.postmaster_pid()
        if pid is None:
            self._reap(timeout=1)
            return
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, _STOP_SIGNALS[mode])
        if not self._wait_gone([pid], _STOP_TIMEOUT_S):
            raise ConfigError(
                f"postgres (pid {pid}) did not stop within {_STOP_TIMEOUT_S} s (mode {mode})"
            )
        self._reap(timeout=5)
        log.info(
            "embedded.stopped",
            extra={
                "port": self._port,
                "mode": mode,
                "elapsed_ms": round((time.monotonic() - t0) * 1000),
            },
        )

    def kill(self) -> None:
        """SIGKILL the postmaster and its children (a simulated crash) and wait until gone."""
        pid = self.postmaster_pid()
        if pid is None:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()  # started but not yet written postmaster.pid
            self._reap(timeout=5)
            return
        t0 = time.monotonic()
        shmid = self._shmid()
        # Freeze the postmaster so it forks no new child while we collect its children;
        # once it is dead they are re-parented and could no longer be found.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        victims = [pid, *_child_pids(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        if not self._wait_gone(victims, _KILL_TIMEOUT_S):
            raise ConfigError(
                f"postgres (pid {pid}) still alive {_KILL_TIMEOUT_S:.0f} s after SIGKILL"
            )
        self._reap(timeout=5)
        # The dead postmaster's lock files and SysV segment stay behind, as after a real
        # crash. Remove them: a zombie with that pid (init does not reap in some containers)
        # would make the next postmaster refuse to start, and a segment that no later start
        # on this data dir reclaims leaks until reboot (the kernel allows 4096 by default).
        if shmid is not None:
            _remove_sysv_segment(shmid)
        self._remove_stale_locks()
        log.info(
            "embedded.killed",
            extra={
                "port": self._port,
                "pg_pid": pid,
                "elapsed_ms": round((time.monotonic() - t0) * 1000),
            },
        )

    def promote(self) -> None:
        """Make this standby a primary (``pg_ctl promote``) and wait until it accepts writes."""
        t0 = time.monotonic()
        args = [self._bin("pg_ctl"), "promote", "-w", "-t", str(_START_TIMEOUT_S), "-D"]
        args.append(str(self.data_dir))
        self._run_tool(args, timeout_s=_START_TIMEOUT_S + 10, failed="pg_ctl promote failed")
        log.info(
            "embedded.promoted",
            extra={"port": self._port, "elapsed_ms": round((time.monotonic() - t0) * 1000)},
        )

    def restart(self) -> None:
        """Stop the cluster (fast) and start it again on the same data dir and port."""
        self.stop("fast")
        self.start()

    def cleanup(self) -> None:
        """Stop the cluster if it runs (immediate) and remove its directory; idempotent."""
        if self._cleaned:
            return
        try:
            if self.running or self._proc is not None:
                try:
                    self.stop("immediate")
                except ConfigError:
                    log.warning("embedded.stop_failed_killing", extra={"port": self._port})
                    self.kill()
        finally:
            self._cleaned = True
            _live.discard(self)
            try:
                shutil.rmtree(self._base)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning(
                    "embedded.rmtree_failed",
                    extra={"data_dir": str(self._base), "detail": str(exc)},
                )
            log.info("embedded.cleaned_up", extra={"data_dir": str(self._base)})

    def __enter__(self) -> EmbeddedPostgres:
        """Start the cluster."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Clean the cluster up."""
        self.cleanup()

    def __repr__(self) -> str:
        """Show port, directory and state."""
        state = "cleaned" if self._cleaned else ("running" if self.running else "stopped")
        return f"<EmbeddedPostgres 127.0.0.1:{self._port} {self._base} {state}>"


def _is_postmaster_of(pid: int, data_dir: Path) -> bool:
    """Tell whether ``pid`` is a postgres process started on ``data_dir``."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.decode(errors="replace") == str(data_dir) for arg in argv)


def _reap_stale(parent: Path) -> None:
    """Stop and remove clusters in ``parent`` left by processes that died without cleanup."""
    try:
        entries = list(parent.glob(f"{_DIR_PREFIX}*"))
    except OSError:
        return
    for base in entries:
        try:
            owner = int((base / _OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue  # not ours, or still being set up
        if owner == os.getpid() or _pid_alive(owner):
            continue
        try:
            pid = int((base / "data" / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            pid = 0
        if pid > 0 and _pid_alive(pid):
            if not _is_postmaster_of(pid, base / "data"):
                continue  # cannot tell that the pid is still that postmaster: leave it alone
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGQUIT)  # immediate shutdown
            deadline = time.monotonic() + _KILL_TIMEOUT_S
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            if _pid_alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)
        log.info("embedded.reaped_stale", extra={"data_dir": str(base), "pg_pid": pid or None})
