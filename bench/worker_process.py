"""Run one library's worker in a child process (bench/peer_worker.py) and meter it.

The child imports its library and says ``ready`` before the timed section; ``go()``
lets it start its worker; ``cpu_s()`` reads its CPU from ``/proc`` (it is not a child
the bench reaps during the section, so ``RUSAGE_CHILDREN`` would not see it in time);
``stop()`` sends SIGTERM and waits, and kills it if it does not stop in time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.to_thread
from server import cpu_of

__all__ = ["WorkerProcess", "worker_process"]

_CHILD = Path(__file__).with_name("peer_worker.py")


class WorkerProcess:
    """A started child; see the module docstring."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def cpu_s(self) -> float:
        """Return the child's user+system CPU seconds so far (its own children included)."""
        cpu = cpu_of(self.proc.pid, children=True)
        if cpu is None:
            raise RuntimeError(f"worker process {self.proc.pid} is gone")
        return cpu

    def alive(self) -> bool:
        return self.proc.poll() is None

    async def stop(self, timeout_s: float = 20.0) -> int:
        """Stop the child gracefully (SIGTERM); return its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return await anyio.to_thread.run_sync(self.proc.wait, timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return await anyio.to_thread.run_sync(self.proc.wait)


@asynccontextmanager
async def worker_process(
    lib: str, url: str, setting: str, record: Path | None = None
) -> AsyncIterator[WorkerProcess]:
    """Start the child and wait until it is ready; stop it when the block ends."""
    argv = [sys.executable, str(_CHILD), lib, url, setting]
    if record is not None:
        argv += ["--record", str(record)]
    env = {**os.environ, "PYTHONPATH": str(_CHILD.parent)}
    proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once; reads go through threads
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    worker = WorkerProcess(proc)
    try:
        assert proc.stdout is not None
        with anyio.fail_after(60):
            line = await anyio.to_thread.run_sync(proc.stdout.readline)
        if line.strip() != "ready":
            raise RuntimeError(f"{lib} worker did not start (exit code {proc.poll()})")
        yield worker
    except BaseException:
        await worker.stop()
        raise
    code = await worker.stop()
    if code not in (0, -signal.SIGTERM):
        raise RuntimeError(f"{lib} worker exited with code {code}")
