"""A subprocess whose output lines a test waits for (``jobsd run``, ``jobsd dev``)."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


class Proc:
    """A subprocess whose stdout and stderr lines are collected as they come."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path = REPO_ROOT) -> None:
        self.args = args
        self.popen = subprocess.Popen(
            args,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(name,), daemon=True)
            for name in ("stdout", "stderr")
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, name: str) -> None:
        stream = self.popen.stdout if name == "stdout" else self.popen.stderr
        assert stream is not None
        for line in stream:
            with self._changed:
                self.lines[name].append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def text(self, name: str = "stderr") -> str:
        """Return everything the process wrote on one stream so far."""
        with self._changed:
            return "\n".join(self.lines[name])

    def wait_for(
        self, pattern: str, *, stream: str = "stderr", timeout_s: float = 20.0
    ) -> re.Match[str]:
        """Wait for a line matching ``pattern``; fail if the process exits or time runs out."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[stream][seen:]:
                    match = regex.search(line)
                    if match:
                        return match
                seen = len(self.lines[stream])
                left = deadline - time.monotonic()
                if left <= 0 or (self.popen.poll() is not None and not self._reading()):
                    raise AssertionError(
                        f"no line matching {pattern!r} on {stream} of {self.args} "
                        f"(exit {self.popen.poll()}):\n{self.text('stderr')[-4000:]}"
                    )
                self._changed.wait(min(left, 0.2))

    def _reading(self) -> bool:
        return any(r.is_alive() for r in self._readers)

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Wait until a daemon logs that it listens and claims."""
        self.wait_for(r"\bdaemon\.ready\b", timeout_s=timeout_s)

    def send(self, sig: signal.Signals) -> None:
        """Send a signal to the process."""
        self.popen.send_signal(sig)

    def wait(self, timeout_s: float = 30.0) -> int:
        """Wait for the exit status; fail (and kill) if the process outlives the timeout."""
        try:
            code = self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
            raise AssertionError(
                f"{self.args} still running after {timeout_s} s:\n{self.text()[-4000:]}"
            ) from None
        for reader in self._readers:
            reader.join(5)
        return code

    def kill(self) -> None:
        """SIGKILL the process if it is alive, and reap it."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)
