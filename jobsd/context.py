"""What a handler sees of its job, and how it reports progress."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Generator, Mapping, Sequence
from typing import Any

from jobsd.jsonsafe import encode_object
from jobsd.tools import DEFAULT_MAX_OUTPUT, ToolResult, run_tool, run_tool_async

__all__ = ["JobContext", "ProgressTooLarge"]


class ProgressTooLarge(ValueError):
    """A handler recorded more progress than ``JOBSD_MAX_PROGRESS_BYTES``: the job fails."""


class _Done:
    """An awaitable that is already complete: ``progress`` works with or without await."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        return
        yield


_DONE = _Done()
_RESERVED = frozenset({"updated_at"})


class JobContext:
    """The one argument of a handler.

    ``checkpoint`` is the progress an earlier attempt saved (empty on a first run): a
    resumable handler reads where it stopped from it.
    """

    def __init__(
        self,
        *,
        id: uuid.UUID,
        type: str,
        org_id: str,
        queue: str,
        payload: dict[str, Any],
        attempt: int,
        checkpoint: dict[str, Any] | None,
        priority: int = 0,
        concurrency_key: str | None = None,
        max_progress_bytes: int | None = None,
    ) -> None:
        self.id = id
        self.type = type
        self.org_id = org_id
        self.queue = queue
        self.payload = payload
        self.attempt = attempt
        self.priority = priority
        self.concurrency_key = concurrency_key
        self.checkpoint: dict[str, Any] = dict(checkpoint or {})
        self._lock = threading.Lock()
        self._pending: dict[str, Any] = {}
        # taken by a heartbeat whose write is not confirmed yet: if the job ends first,
        # that write finds the job no longer running and the final write must carry them
        self._sending: dict[str, Any] = {}
        # a flag, not a threading.Event: set once by the daemon, read by the handler
        # (a sync one from its thread: one attribute write is atomic)
        self._cancelled = False
        self.max_progress_bytes = max_progress_bytes
        self.progress_too_large: str | None = None
        """set when a ``progress`` call went over the cap: the run fails with it"""
        self.last_activity = time.monotonic()
        """when the run started or last reported progress (``time.monotonic``)"""

    @property
    def cancelled(self) -> bool:
        """Say whether the job was cancelled (or its lease lost): stop and return.

        Async handlers are cancelled outright; a sync handler's thread cannot be, so it
        should check this between steps.
        """
        return self._cancelled

    def mark_cancelled(self) -> None:
        """Raise the ``cancelled`` flag (the daemon does; handlers only read it)."""
        self._cancelled = True

    def run_tool(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ToolResult:
        """Run an external program to its end and return its ``ToolResult`` (exit code,
        stdout, stderr, each kept up to ``max_output`` bytes and said truncated past
        it). The program gets no stdin and none of the handler's file descriptors; it
        runs in a process group of its own, ended whole past ``timeout`` seconds
        (``ToolTimeout``), when this job is cancelled (``ToolCancelled``), or when the
        program exits and leaves something running. A program that does not exist
        raises ``FileNotFoundError``. For a sync handler; an async one awaits
        ``run_tool_async``.
        """
        return run_tool(
            argv,
            timeout=timeout,
            max_output=max_output,
            cwd=cwd,
            env=env,
            cancelled=lambda: self._cancelled,
        )

    async def run_tool_async(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the tool's, not the await's)
        max_output: int = DEFAULT_MAX_OUTPUT,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ToolResult:
        """``run_tool`` for an async handler: the event loop goes on while the program
        runs, and a cancelled handler ends the program's group before it stops."""
        return await run_tool_async(
            argv,
            timeout=timeout,
            max_output=max_output,
            cwd=cwd,
            env=env,
            cancelled=lambda: self._cancelled,
        )

    def progress(self, done: int | None = None, total: int | None = None, **fields: Any) -> _Done:
        """Record progress; jobsd writes it in the background, throttled.

        Writes happen at most every ``progress_interval`` (1 s by default), and once
        more with the outcome. Call it per batch or step, not per row. Async handlers
        may ``await`` it; sync handlers call it plainly. The fields are merged into the
        job's ``progress`` and become the ``checkpoint`` of a later attempt.
        """
        if done is not None:
            fields["done"] = done
        if total is not None:
            fields["total"] = total
        clash = _RESERVED.intersection(fields)
        if clash:
            raise ValueError(f"progress field {sorted(clash)[0]!r} is reserved for jobsd")
        # refuse here what Postgres would refuse later (NaN, NUL, lone surrogates), and
        # keep a copy: the handler may go on mutating the objects it passed
        fields = json.loads(encode_object(fields, what="progress", max_bytes=None))
        with self._lock:
            if self.max_progress_bytes is not None:
                merged = {**self.checkpoint, **fields}
                size = len(encode_object(merged, what="progress", max_bytes=None).encode())
                if size > self.max_progress_bytes:
                    self.progress_too_large = (
                        f"progress too large: {size} bytes, over the limit of "
                        f"{self.max_progress_bytes} bytes"
                    )
                    raise ProgressTooLarge(self.progress_too_large)
            self._pending.update(fields)
            self.checkpoint.update(fields)
            self.last_activity = time.monotonic()
        return _DONE

    def take_pending(self) -> dict[str, Any] | None:
        """Return and clear the progress not yet written, for a heartbeat to write.

        The fields stay in flight until ``pending_written`` or ``restore_pending``.
        """
        with self._lock:
            if not self._pending:
                return None
            pending, self._pending = self._pending, {}
            self._sending.update(pending)
            return pending

    def pending_written(self) -> None:
        """Confirm that the fields last taken are in the database."""
        with self._lock:
            self._sending = {}

    def restore_pending(self, fields: dict[str, Any]) -> None:
        """Put back progress whose write failed, under anything recorded since."""
        with self._lock:
            self._pending = {**fields, **self._pending}
            self._sending = {}

    def take_final(self) -> dict[str, Any] | None:
        """Return every field not known to be written, for the run's outcome write."""
        with self._lock:
            final = {**self._sending, **self._pending}
            self._pending = {}
            return final or None

    @property
    def has_pending(self) -> bool:
        """Say whether progress is waiting to be written."""
        return bool(self._pending)
