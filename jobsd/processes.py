"""End every process a handler started, even after a kill -9 of the daemon.

Handler processes (``children.py``) each lead a session of their own, and the tools
they start stay in it. Ending a run ends the whole session: SIGTERM to every member,
``grace_s`` to exit, then the survivors are frozen (SIGSTOP: no more forks) and killed
(SIGKILL), until none is left (``end_processes``). Processes are found in ``/proc`` by
session, process group and descent (``snapshot``), so a tool that made a process group
of its own is found too.

A daemon killed with SIGKILL ends nothing itself. Its children die with it
(``PR_SET_PDEATHSIG``), but not what they started: for those, the daemon runs this
module as a small process of its own, the reaper (``python -I -S processes.py GRACE``).
The daemon tells it on its stdin which sessions and groups are in use (``+s123``,
``-s123``, ``+g456``, ``-g456``); when that pipe closes, whatever the reason, the
reaper ends every session and group still listed, then exits. The reaper imports
nothing of jobsd (it starts in milliseconds) and ignores SIGINT and SIGTERM: the
daemon's end, not a signal, is what sets it to work.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "Proc",
    "Reaper",
    "end_processes",
    "members",
    "rss_bytes",
    "set_child_subreaper",
    "snapshot",
]

PR_SET_CHILD_SUBREAPER = 36
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True, slots=True)
class Proc:
    """One process as ``/proc/PID/stat`` gives it."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    zombie: bool


def snapshot() -> list[Proc]:
    """Return every process of this machine (of this PID namespace) now."""
    procs: list[Proc] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return procs
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parens
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 4:
            continue
        procs.append(
            Proc(
                pid=int(name),
                ppid=int(fields[1]),
                pgid=int(fields[2]),
                sid=int(fields[3]),
                zombie=fields[0] in (b"Z", b"X"),
            )
        )
    return procs


def members(
    procs: Iterable[Proc],
    *,
    sessions: Iterable[int] = (),
    groups: Iterable[int] = (),
    roots: Iterable[int] = (),
) -> set[int]:
    """Return the live processes in ``sessions`` or ``groups``, or descended from (or
    being) one of ``roots``. Zombies are dead already: they are left out."""
    sessions, groups, roots = set(sessions), set(groups), set(roots)
    live = [p for p in procs if not p.zombie]
    found = {p.pid for p in live if p.sid in sessions or p.pgid in groups or p.pid in roots}
    if roots:
        kids: dict[int, list[int]] = {}
        for p in live:
            kids.setdefault(p.ppid, []).append(p.pid)
        todo = [p.pid for p in live if p.pid in roots]
        while todo:
            for kid in kids.get(todo.pop(), ()):
                found.add(kid)
                todo.append(kid)
    found.discard(os.getpid())
    return found


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def end_processes(
    find: Callable[[], set[int]],
    grace_s: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    reap: Callable[[], object] | None = None,
) -> int:
    """End the processes ``find`` returns: SIGTERM, up to ``grace_s`` for them to exit,
    then SIGSTOP and SIGKILL until ``find`` returns none. Return how many were found
    first. ``reap`` (if given) collects exited children between looks."""
    first = find()
    if not first:
        return 0
    _signal(first, signal.SIGTERM)
    _signal(first, signal.SIGCONT)  # a stopped process handles its SIGTERM once resumed
    deadline = time.monotonic() + grace_s
    while True:
        if reap is not None:
            reap()
        left = find()
        if not left:
            return len(first)
        if time.monotonic() >= deadline:
            break
        sleep(min(0.02, max(deadline - time.monotonic(), 0.0)))
    for _ in range(1000):
        # frozen processes cannot fork: look again until no new one appears, then kill
        _signal(left, signal.SIGSTOP)
        more = find()
        while not more <= left:
            left |= more
            _signal(more, signal.SIGSTOP)
            more = find()
        _signal(left, signal.SIGKILL)
        sleep(0.005)
        if reap is not None:
            reap()
        left = find()
        if not left:
            break
    return len(first)


def set_child_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux): a tool whose
    parent exits stays below it, where ``members(roots=...)`` finds it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def rss_bytes(pid: int) -> int | None:
    """Return the resident memory of ``pid`` in bytes, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


class Reaper:
    """The daemon's side of the reaper process: what to end if the daemon dies."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._process: subprocess.Popen[bytes] | None = None
        self._listed: set[str] = set()
        """the sessions (``s123``) and groups (``g456``) to end if the daemon dies"""
        self._lock = threading.Lock()
        """tools started from handler threads tell it too"""

    def _start(self) -> subprocess.Popen[bytes] | None:
        """Return the reaper process, started (again) if it is not running."""
        process = self._process
        if process is not None and process.poll() is None:
            return process
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", __file__, str(self.grace_s)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # no terminal's Ctrl-C, no group's signal
            )
        except OSError:
            return None
        self._process = process
        # a reaper started again learns everything still listed
        self._write(process, "".join(f"+{entry}\n" for entry in self._listed))
        return process

    @staticmethod
    def _write(process: subprocess.Popen[bytes], text: str) -> None:
        assert process.stdin is not None
        if text:
            with contextlib.suppress(OSError):
                os.write(process.stdin.fileno(), text.encode())

    @staticmethod
    def _entry(session: int | None, group: int | None) -> str:
        return f"s{session}" if session is not None else f"g{group}"

    def watch(self, *, session: int | None = None, group: int | None = None) -> None:
        """End this session (or process group) if the daemon dies."""
        entry = self._entry(session, group)
        with self._lock:
            self._listed.add(entry)
            process = self._start()
            if process is not None:
                self._write(process, f"+{entry}\n")

    def forget(self, *, session: int | None = None, group: int | None = None) -> None:
        """The session (or group) ended: nothing to end there any more."""
        entry = self._entry(session, group)
        with self._lock:
            if entry in self._listed:
                self._listed.discard(entry)
                if self._process is not None and self._process.poll() is None:
                    self._write(self._process, f"-{entry}\n")

    def close(self) -> None:
        """Let the reaper go: the daemon ended what it started (what is still listed
        is ended by the reaper now)."""
        with self._lock:
            process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            assert process.stdin is not None
            process.stdin.close()
        try:
            process.wait(timeout=self.grace_s + 5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _reap_children() -> None:
    """Collect this process's exited children."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> None:
    """The reaper process: read the listed sessions and groups until stdin closes, then
    end what is left of them."""
    grace_s = float(argv[0]) if argv else 2.0
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sessions: set[int] = set()
    groups: set[int] = set()
    for raw in sys.stdin.buffer:
        line = raw.strip().decode()
        if len(line) < 3:
            continue
        target = sessions if line[1] == "s" else groups
        if line[0] == "+":
            target.add(int(line[2:]))
        else:
            target.discard(int(line[2:]))
    if sessions or groups:
        end_processes(
            lambda: members(snapshot(), sessions=sessions, groups=groups),
            grace_s,
            reap=_reap_children,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
