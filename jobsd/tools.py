"""Run an external program for a handler (``ctx.run_tool``): bounded in time and output,
with nothing left behind.

The tool gets no stdin, no file descriptor of the handler's but its pipes, and a
process group of its own (in its handler's session, where the daemon's kill of a run
finds it). Its stdout and stderr are read as they come; the first ``max_output``
bytes of each are kept, the rest is read and counted, not kept (``*_truncated``).
When the tool exits, whatever it left running in its group is ended; past
``timeout``, or when the job is cancelled, its whole group is ended: SIGTERM,
``kill_grace`` seconds, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from jobsd.errors import JobsdError
from jobsd.processes import end_processes, members, snapshot

__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "ToolCancelled",
    "ToolError",
    "ToolFailed",
    "ToolResult",
    "ToolTimeout",
    "run_tool",
    "run_tool_async",
]

DEFAULT_MAX_OUTPUT = 1_048_576
"""bytes of stdout, and of stderr, a result keeps unless told"""
DEFAULT_KILL_GRACE_S = 2.0
_CHUNK = 65536
_LOOK_S = 0.1
"""how often a cancel request is looked for while the tool runs"""

GroupWatch = Callable[[int, bool], None]
_group_watch: GroupWatch | None = None


def set_group_watch(watch: GroupWatch | None, *, only_if: GroupWatch | None = None) -> None:
    """Have ``watch(pgid, started)`` told of every tool's process group as it starts and
    ends (the daemon's reaper, so that a kill -9 of the daemon ends them); with
    ``only_if``, only if that is the one set now."""
    global _group_watch
    if only_if is None or _group_watch == only_if:
        _group_watch = watch


@dataclass(frozen=True, slots=True)
class ToolResult:
    """How a tool ended, and what it printed (at most ``max_output`` bytes of each)."""

    argv: list[str]
    returncode: int
    """the exit code; negative: killed by that signal"""
    stdout: bytes
    stderr: bytes
    stdout_bytes: int
    """everything the tool wrote on stdout, kept or not"""
    stderr_bytes: int
    duration_s: float
    max_output: int = field(repr=False)

    @property
    def stdout_truncated(self) -> bool:
        """Say whether the tool wrote more on stdout than was kept."""
        return self.stdout_bytes > len(self.stdout)

    @property
    def stderr_truncated(self) -> bool:
        """Say whether the tool wrote more on stderr than was kept."""
        return self.stderr_bytes > len(self.stderr)

    @property
    def text(self) -> str:
        """stdout as text (UTF-8, undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    def check(self) -> ToolResult:
        """Return this result if the tool exited 0, else raise ``ToolFailed``."""
        if self.returncode != 0:
            raise ToolFailed(self)
        return self

    def describe(self) -> str:
        """Say in one line how it ended, with the truncations."""
        how = (
            f"exited with code {self.returncode}"
            if self.returncode >= 0
            else f"killed by signal {-self.returncode}"
        )
        notes = [
            f"{name} truncated to {self.max_output} of {total} bytes"
            for name, total, kept in (
                ("stdout", self.stdout_bytes, self.stdout),
                ("stderr", self.stderr_bytes, self.stderr),
            )
            if total > len(kept)
        ]
        return f"{self.argv[0]} {how}" + (f" ({'; '.join(notes)})" if notes else "")


class ToolError(JobsdError):
    """A tool run by ``ctx.run_tool`` did not end well; ``result`` holds what it printed."""

    def __init__(self, message: str, result: ToolResult) -> None:
        super().__init__(message)
        self.result = result


class ToolFailed(ToolError):
    """The tool exited with a non-zero code (raised by ``ToolResult.check``)."""

    def __init__(self, result: ToolResult) -> None:
        tail = result.stderr[-500:].decode("utf-8", "replace").strip()
        super().__init__(result.describe() + (f": {tail}" if tail else ""), result)


class ToolTimeout(ToolError, TimeoutError):
    """The tool ran past its timeout: its process group was ended."""


class ToolCancelled(ToolError):
    """The job was cancelled while the tool ran: its process group was ended."""


def _checked(
    argv: Sequence[str], timeout: float | None, max_output: int
) -> tuple[list[str], float | None]:
    if isinstance(argv, str | bytes) or not isinstance(argv, Sequence):
        raise TypeError(f"argv must be a list of strings, not {type(argv).__name__}")
    if not argv or not all(isinstance(arg, str) for arg in argv):
        raise TypeError(f"argv must be a non-empty list of strings: {list(argv)!r:.200}")
    if timeout is not None and (isinstance(timeout, bool) or not timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
    if isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 0:
        raise ValueError(f"max_output must be a number of bytes (0 or more), not {max_output!r}")
    return list(argv), timeout


def run_tool(
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    max_output: int = DEFAULT_MAX_OUTPUT,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    kill_grace: float = DEFAULT_KILL_GRACE_S,
    cancelled: Callable[[], bool] = lambda: False,
) -> ToolResult:
    """Run ``argv`` to its end and return its result; see the module.

    Raises ``FileNotFoundError`` (or ``PermissionError``) when the program cannot be
    started, ``ToolTimeout`` past ``timeout``, ``ToolCancelled`` once ``cancelled()``
    is true. A non-zero exit is returned: ``result.check()`` raises it.
    """
    args, timeout = _checked(argv, timeout, max_output)
    started = time.monotonic()
    process = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=None if env is None else dict(env),
        close_fds=True,
        process_group=0,
    )
    pgid = process.pid
    watch = _group_watch
    if watch is not None:
        watch(pgid, True)
    assert process.stdout is not None and process.stderr is not None
    out_fd, err_fd = process.stdout.fileno(), process.stderr.fileno()
    kept = {out_fd: bytearray(), err_fd: bytearray()}
    total = {out_fd: 0, err_fd: 0}
    ended: type[ToolError] | None = None
    try:
        with selectors.DefaultSelector() as selector:
            for fd in (out_fd, err_fd):
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                if cancelled():
                    ended = ToolCancelled
                elif timeout is not None and time.monotonic() - started >= timeout:
                    ended = ToolTimeout
                if ended is not None:
                    _end_group(pgid, kill_grace)
                wait_s = _LOOK_S
                if timeout is not None:
                    wait_s = min(wait_s, max(timeout - (time.monotonic() - started), 0.0))
                for key, _ in selector.select(wait_s):
                    fd = int(key.fd)
                    chunk = os.read(fd, _CHUNK)
                    if not chunk:
                        selector.unregister(fd)
                        continue
                    total[fd] += len(chunk)
                    room = max_output - len(kept[fd])
                    if room > 0:
                        kept[fd] += chunk[:room]
                if process.poll() is not None and selector.get_map():
                    # the tool is gone; what it left in its group holds the pipes open
                    _end_group(pgid, kill_grace)
        process.wait()
        _end_group(pgid, kill_grace)
    except BaseException:
        _end_group(pgid, kill_grace)
        process.wait()
        raise
    finally:
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        if watch is not None:
            watch(pgid, False)
    result = ToolResult(
        argv=args,
        returncode=process.returncode,
        stdout=bytes(kept[out_fd]),
        stderr=bytes(kept[err_fd]),
        stdout_bytes=total[out_fd],
        stderr_bytes=total[err_fd],
        duration_s=time.monotonic() - started,
        max_output=max_output,
    )
    if ended is ToolTimeout:
        raise ToolTimeout(f"{args[0]} ran past its timeout of {timeout:g} s: ended", result)
    if ended is ToolCancelled:
        raise ToolCancelled(f"{args[0]} ended: the job was cancelled", result)
    return result


def _end_group(pgid: int, grace_s: float) -> None:
    """End every process of the tool's group, if any is left."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return
    end_processes(lambda: members(snapshot(), groups=[pgid]), grace_s)


async def run_tool_async(
    argv: Sequence[str],
    *,
    timeout: float | None = None,  # noqa: ASYNC109 (the tool's, not the await's)
    max_output: int = DEFAULT_MAX_OUTPUT,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    kill_grace: float = DEFAULT_KILL_GRACE_S,
    cancelled: Callable[[], bool] = lambda: False,
) -> ToolResult:
    """``run_tool`` for an async handler: the tool runs while the event loop goes on,
    and cancelling the awaiting task ends the tool's group before the cancellation
    goes on."""
    _checked(argv, timeout, max_output)
    stop = threading.Event()
    finished = threading.Event()

    def work() -> ToolResult:
        try:
            return run_tool(
                argv,
                timeout=timeout,
                max_output=max_output,
                cwd=cwd,
                env=env,
                kill_grace=kill_grace,
                cancelled=lambda: stop.is_set() or cancelled(),
            )
        finally:
            finished.set()

    # handlers run in the daemon, which has anyio: an application that imports jobsd
    # only to enqueue does not need it
    import anyio.to_thread

    try:
        return await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        stop.set()
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await anyio.to_thread.run_sync(finished.wait)
        raise
