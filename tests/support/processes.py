"""What the tests ask of other processes."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie waiting to be reaped.

    A process can end between the signal and the read of its ``/proc`` entry, which
    then counts as not alive.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


MARK_VAR = "JOBSD_TEST_MARK"
"""an environment variable the tests give the tools a handler starts: every process
below them inherits it, so they can be counted"""


def marked(mark: str) -> list[int]:
    """Return the live processes whose environment holds ``JOBSD_TEST_MARK=mark``."""
    needle = f"{MARK_VAR}={mark}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as env:
                entries = env.read().split(b"\0")
        except OSError:
            continue
        if needle in entries and pid_alive(int(name)):
            found.append(int(name))
    return found


def in_session(sid: int) -> list[int]:
    """Return the live processes of session ``sid`` (a handler process's, and its tools')."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(name))
    return found


def leftovers(children: list[int], tools: list[int]) -> list[int]:
    """Return what is still alive of handler processes, their sessions and their tools."""
    alive = {pid for pid in [*children, *tools] if pid_alive(pid)}
    for child in children:
        alive.update(in_session(child))
    return sorted(alive)
