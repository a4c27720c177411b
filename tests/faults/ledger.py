"""The ground truth of the fault campaign: what handlers really ran, outside jobsd's tables.

Handlers append one JSON line per event to a file opened with ``O_APPEND`` (one
``write`` per line, so lines of concurrent processes never interleave): ``start`` before
the work, ``end`` after it. A line written before a ``kill -9`` survives it (it is in
the page cache); nothing here simulates a machine crash, so there is no fsync.

Times are ``time.monotonic()`` (one clock for every process of the machine, and the one
``faketime`` leaves alone with ``DONT_FAKE_MONOTONIC=1``) and ``time.time()``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Ledger", "Run", "read_runs"]


class Ledger:
    """Append start and end lines for job runs to one file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.fd = os.open(os.fspath(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _write(self, **fields: Any) -> None:
        line = json.dumps(
            {**fields, "pid": os.getpid(), "mono": time.monotonic(), "wall": time.time()},
            default=str,
        )
        os.write(self.fd, (line + "\n").encode())

    def start(self, job_id: uuid.UUID, attempt: int, type: str, **extra: Any) -> None:
        """Record that a run begins (its side effect happens now)."""
        self._write(ev="start", job=str(job_id), attempt=attempt, type=type, **extra)

    def end(self, job_id: uuid.UUID, attempt: int, type: str, outcome: str) -> None:
        """Record that a run ended: ``ok``, ``cancelled`` or ``error``."""
        self._write(ev="end", job=str(job_id), attempt=attempt, type=type, outcome=outcome)


@dataclass
class Run:
    """One execution of a handler, as the ledger saw it."""

    job: str
    attempt: int
    type: str
    pid: int
    start_mono: float
    start_wall: float
    end_mono: float | None = None
    outcome: str | None = None
    extra: dict[str, Any] | None = None

    def overlaps(self, other: Run, ends: dict[int, float]) -> bool:
        """Say whether two runs were alive at once; a run with no end lasted until its
        process died (``ends``: pid -> monotonic time of death), else forever."""
        a_end = self.end_mono if self.end_mono is not None else ends.get(self.pid, float("inf"))
        b_end = other.end_mono if other.end_mono is not None else ends.get(other.pid, float("inf"))
        return self.start_mono < b_end and other.start_mono < a_end


def read_runs(path: str | os.PathLike[str]) -> dict[str, list[Run]]:
    """Read the ledger: every run, grouped by job id, in start order."""
    runs: dict[str, list[Run]] = defaultdict(list)
    open_runs: dict[tuple[str, int, int], Run] = {}
    file = Path(path)
    if not file.exists():
        return {}
    for line in file.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        key = (rec["job"], rec["attempt"], rec["pid"])
        if rec["ev"] == "start":
            extra = {
                k: v
                for k, v in rec.items()
                if k not in ("ev", "job", "attempt", "type", "pid", "mono", "wall")
            }
            run = Run(
                rec["job"],
                rec["attempt"],
                rec["type"],
                rec["pid"],
                rec["mono"],
                rec["wall"],
                extra=extra or None,
            )
            open_runs[key] = run
            runs[rec["job"]].append(run)
        elif key in open_runs:
            run = open_runs.pop(key)
            run.end_mono, run.outcome = rec["mono"], rec.get("outcome")
    for job_runs in runs.values():
        job_runs.sort(key=lambda r: r.start_mono)
    return dict(runs)
