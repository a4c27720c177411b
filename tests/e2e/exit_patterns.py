"""Run a client pattern many times, each in a forked child that exits like a script.

Usage: ``python exit_patterns.py PATTERN_FILE RUNS PARALLEL TIMEOUT_S``. jobsd is
imported once, here, before the forks: a child costs the pattern, not an interpreter
start. Each child runs the pattern as ``__main__`` with stderr in a file of its own,
then raises SystemExit at the top of this script: the interpreter's whole shutdown
runs (atexit hooks, the finalizers of what the pattern left open), as for a script. A
child still alive after TIMEOUT_S hangs: it is killed and counted. Prints one JSON
object: runs, hangs, failed (exit status not 0), stderr (the non-empty ones).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import traceback

import jobsd  # noqa: F401  (imported once, before the forks)


def child(source: str, err_path: str) -> None:
    """Run the pattern in this (forked) process; never returns: SystemExit unwinds."""
    err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(err, 2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    try:
        exec(compile(source, "<pattern>", "exec"), {"__name__": "__main__"})
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            raise
        traceback.print_exc()
        raise SystemExit(1) from None
    raise SystemExit(0)


def main() -> None:
    path, runs, parallel, timeout_s = sys.argv[1], *map(int, sys.argv[2:4]), float(sys.argv[4])
    with open(path) as f:
        source = f.read()
    out_dir = tempfile.mkdtemp(prefix="jobsd-exit-")
    running: dict[int, tuple[float, str]] = {}
    hangs = failed = started = 0
    errors: list[str] = []
    while started < runs or running:
        while started < runs and len(running) < parallel:
            err_path = os.path.join(out_dir, f"{started}.err")
            pid = os.fork()
            if pid == 0:
                child(source, err_path)
            running[pid] = (time.monotonic() + timeout_s, err_path)
            started += 1
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            now = time.monotonic()
            for late, (deadline, _) in list(running.items()):
                if now > deadline:
                    os.kill(late, signal.SIGKILL)
                    os.waitpid(late, 0)
                    hangs += 1
                    errors.append(_read(running.pop(late)[1]) + "\n[hung: killed]")
            time.sleep(0.01)  # the parent's own poll of its children, not a test's sync
            continue
        _, err_path = running.pop(pid)
        text = _read(err_path)
        if os.waitstatus_to_exitcode(status) != 0:
            failed += 1
        if text:
            errors.append(text)
    print(json.dumps({"runs": runs, "hangs": hangs, "failed": failed, "stderr": errors}))


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


if __name__ == "__main__":
    main()
