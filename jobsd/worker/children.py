"""The handler processes (``isolation="process"``): a pool of children the daemon owns.

Model: each child (``child.py``) runs one job at a time and is reused while it lives.
A request goes down its stdin as one JSON line; progress and the answer come back on
its stdout, one JSON line each, at most ``max_line_bytes`` long. A child that dies
mid-job (segfault, ``os._exit``, OOM kill) fails that job alone, with the signal or
exit code in the cause, and is not reused.

A child writes to the daemon's stderr; it sets up jobsd's logging as the daemon did
(``setup_logging``'s level and format), so a handler's lines look the same in either
and carry their job.

Each child leads a session of its own; the tools its handlers start belong to it. A
run that is cancelled (timeout, stall, cancel request, shutdown, lost lease) ends the
child's whole session and everything below the child: SIGTERM, then SIGKILL after
``kill_grace_s`` (``processes.end_processes``); that is complete before the run's outcome
is handed over. Children die with the daemon, even on kill -9 (``PR_SET_PDEATHSIG``),
and the reaper process ends what they started (``processes.py``).

Children are recycled: one that ran its type's ``max_jobs_per_child`` jobs, or whose
memory passed ``RECYCLE_AT`` of its ``max_child_memory`` after a job, is replaced
before the next one. One that passes ``max_child_memory`` during a job is killed
there, and the job fails with cause ``memory limit``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import anyio.to_thread
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from jobsd.context import JobContext, ProgressTooLarge
from jobsd.logs import installed as installed_logging
from jobsd.processes import Reaper, end_processes, members, rss_bytes, snapshot
from jobsd.worker.child import context_message

__all__ = ["Answer", "Child", "ChildLimits", "ChildPool", "ChildSettings", "describe_exit"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Answer:
    """How an isolated run ended."""

    kind: Literal[
        "result", "error", "invalid", "crashed", "memory", "too_large", "progress_too_large"
    ]
    report: dict[str, Any] | None = None
    message: str = ""
    detail: dict[str, Any] | None = None


def describe_exit(returncode: int | None) -> str:
    """Say how a child ended: ``killed by signal SIGSEGV (11)`` or ``exited with code 3``."""
    if returncode is None:
        return "ended without an exit status"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "signal"
        return f"killed by signal {name} ({-returncode})"
    return f"exited with code {returncode}"


class Child:
    """One child process and the reader of its answers."""

    def __init__(self, process: Process, max_line_bytes: int) -> None:
        self.process = process
        assert process.stdout is not None and process.stdin is not None
        self.reader = BufferedByteReceiveStream(process.stdout)
        self.max_line_bytes = max_line_bytes
        self.jobs = 0
        """jobs this child ran (or began)"""
        self.over_memory: int | None = None
        """the resident size at which it was killed for passing its memory limit"""

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass(frozen=True, slots=True)
class ChildSettings:
    """How children are stopped and how much they may send."""

    kill_grace_s: float
    """``JOBSD_KILL_GRACE``: between SIGTERM and SIGKILL"""
    max_line_bytes: int
    """the longest message a child may send (a report or a progress record)"""
    max_idle: int
    """children kept for reuse"""


@dataclass(frozen=True, slots=True)
class ChildLimits:
    """When a child is replaced: the limits of the type it runs."""

    max_jobs: int | None = None
    """``max_jobs_per_child``: replaced after this many jobs"""
    max_memory: int | None = None
    """``max_child_memory`` in bytes: killed past it during a job (the job fails,
    ``memory limit``), replaced past ``RECYCLE_AT`` of it after one"""


RECYCLE_AT = 0.8
"""a child whose resident size passed this share of its ``max_memory`` after a job is
replaced before the next: a slow leak retires children, it does not fail jobs"""
MEMORY_CHECK_S = 0.1
"""how often a running child's resident size is read when it has a memory limit"""

STARTUP_TIMEOUT_S = 60.0
"""how long a new child may take to import jobsd and say it is ready"""


class ChildPool:
    """Run handlers in supervised child processes, one job per child at a time."""

    def __init__(self, cfg: ChildSettings) -> None:
        self.cfg = cfg
        self._idle: list[Child] = []
        self._closed = False
        self.started = 0
        """children started so far (a crashed or killed child is replaced)"""
        self.pids: set[int] = set()
        """children alive now"""
        self.recycled = 0
        """children replaced for their job count or memory"""
        self.reaper = Reaper(cfg.kill_grace_s)

    async def warm(self, count: int) -> None:
        """Start ``count`` idle children now, together (at daemon start: a first run
        should not wait for a child to import jobsd)."""

        async def one() -> None:
            try:
                child = await self._spawn()
            except Exception:  # a run that needs a child will say why it has none
                log.error("child.start_failed", exc_info=True)
                return
            self._idle.append(child)

        async with anyio.create_task_group() as tg:
            for _ in range(min(count, self.cfg.max_idle) - len(self._idle)):
                tg.start_soon(one)

    async def acquire(self) -> Child:
        """Take an idle child, or start one (a run's timeout starts after this)."""
        return self._idle.pop() if self._idle else await self._spawn()

    async def run(
        self, child: Child, func_ref: str, ctx: JobContext, limits: ChildLimits | None = None
    ) -> Answer:
        """Run ``func_ref`` (``module:qualname``) for ``ctx`` in ``child`` (from
        ``acquire``); return how it ended. Cancellation ends the child (and all it
        started), then propagates."""
        limits = limits or ChildLimits()
        request = {
            "func": func_ref,
            "ctx": context_message(ctx),
        }
        reusable = False
        child.jobs += 1
        try:
            if limits.max_memory is None:
                answer = await self._exchange(child, request, ctx)
            else:
                answer = await self._exchange_watched(child, request, ctx, limits.max_memory)
            reusable = answer.kind in ("result", "error", "invalid")
            return answer
        finally:
            if reusable and self._worn(child, limits):
                reusable = False
                self.recycled += 1
            if reusable and not self._closed and len(self._idle) < self.cfg.max_idle:
                self._idle.append(child)
            else:
                await self._stop(child, idle=reusable)

    @staticmethod
    def _worn(child: Child, limits: ChildLimits) -> bool:
        """Say whether ``child`` must be replaced before its next job."""
        if limits.max_jobs is not None and child.jobs >= limits.max_jobs:
            log.info("child.recycled", extra={"child_pid": child.pid, "jobs": child.jobs})
            return True
        if limits.max_memory is not None:
            rss = rss_bytes(child.pid)
            if rss is not None and rss >= limits.max_memory * RECYCLE_AT:
                log.info("child.recycled", extra={"child_pid": child.pid, "rss_bytes": rss})
                return True
        return False

    async def _exchange_watched(
        self, child: Child, request: dict[str, Any], ctx: JobContext, max_memory: int
    ) -> Answer:
        """``_exchange``, with the child killed if its resident size passes
        ``max_memory``: the answer is then ``memory``."""
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                while True:
                    await anyio.sleep(MEMORY_CHECK_S)
                    rss = rss_bytes(child.pid)
                    if rss is not None and rss > max_memory:
                        child.over_memory = rss
                        log.warning(
                            "child.over_memory",
                            extra={"child_pid": child.pid, "rss_bytes": rss},
                        )
                        await self._end_tree(child, grace_s=0.0)
                        return

            tg.start_soon(watch)
            answer = await self._exchange(child, request, ctx)
            tg.cancel_scope.cancel()
        if child.over_memory is not None:
            return Answer(
                "memory",
                message=f"memory limit: the handler process reached {child.over_memory} "
                f"bytes, over its limit of {max_memory} bytes",
                detail={"pid": child.pid, "rss_bytes": child.over_memory},
            )
        return answer

    async def _exchange(self, child: Child, request: dict[str, Any], ctx: JobContext) -> Answer:
        assert child.process.stdin is not None
        try:
            await child.process.stdin.send(json.dumps(request).encode() + b"\n")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return await self._crashed(child)
        while True:
            try:
                line = await child.reader.receive_until(b"\n", child.max_line_bytes)
            except anyio.DelimiterNotFound:
                return Answer(
                    "too_large",
                    message=f"report too large: the handler sent more than "
                    f"{child.max_line_bytes} bytes",
                )
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                return await self._crashed(child)
            message = json.loads(line)
            match message["op"]:
                case "progress":
                    try:
                        ctx.progress(**message["fields"])
                    except ProgressTooLarge as exc:
                        return Answer("progress_too_large", message=str(exc))
                case "result":
                    return Answer("result", report=message["report"])
                case "invalid":
                    return Answer("invalid", message=message["message"])
                case _:
                    return Answer(
                        "error",
                        message=message["message"],
                        detail={
                            "type": message["type"],
                            "traceback": message["traceback"],
                            "mro": message.get("mro", []),
                        },
                    )

    async def _crashed(self, child: Child) -> Answer:
        with anyio.move_on_after(self.cfg.kill_grace_s):
            await child.process.wait()
        how = describe_exit(child.process.returncode)
        log.warning("child.died", extra={"child_pid": child.pid, "how": how})
        return Answer(
            "crashed",
            message=f"handler process {how}",
            detail={"pid": child.pid, "returncode": child.process.returncode},
        )

    async def _spawn(self) -> Child:
        env = dict(os.environ)
        # the child imports the handler's module: give it the daemon's import path
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        command = [
            sys.executable,
            "-m",
            "jobsd.worker.child",
            str(os.getpid()),
            str(self.cfg.kill_grace_s),
        ]
        logging_setup = installed_logging()
        if logging_setup is not None:  # the child logs as the daemon does
            command += logging_setup
        process = await anyio.open_process(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            env=env,
            start_new_session=True,  # its tools are its session's: ended with it
        )
        self.reaper.watch(session=process.pid)
        self.started += 1
        self.pids.add(process.pid)
        child = Child(process, self.cfg.max_line_bytes)
        try:
            # a run's limits start once the child has imported jobsd, not before
            with anyio.fail_after(STARTUP_TIMEOUT_S):
                line = await child.reader.receive_until(b"\n", child.max_line_bytes)
            if json.loads(line).get("op") != "ready":
                raise ValueError(f"unexpected first message {line[:200]!r}")
        except BaseException:
            await self._stop(child)
            raise
        log.debug("child.started", extra={"child_pid": process.pid})
        return child

    async def _end_tree(self, child: Child, grace_s: float) -> int:
        """End ``child``, its session and everything below it: SIGTERM, ``grace_s``,
        then SIGKILL. Return how many processes there were."""
        pid = child.pid

        def find() -> set[int]:
            return members(snapshot(), sessions=[pid], roots=[pid])

        return await anyio.to_thread.run_sync(end_processes, find, grace_s)

    async def _stop(self, child: Child, *, idle: bool = False) -> None:
        """End a child and all it started (SIGTERM, then SIGKILL after the grace)."""
        with anyio.CancelScope(shield=True):
            process = child.process
            if idle and process.returncode is None and process.stdin is not None:
                # an idle child holds nothing: closing its stdin ends it at once
                with contextlib.suppress(anyio.BrokenResourceError, OSError):
                    await process.stdin.aclose()
                with anyio.move_on_after(1.0):
                    await process.wait()
            ended = await self._end_tree(child, self.cfg.kill_grace_s)
            if ended > 1:
                log.warning("child.killed", extra={"child_pid": child.pid, "processes": ended})
            await process.wait()
            await process.aclose()
            self.reaper.forget(session=child.pid)
            self.pids.discard(child.pid)

    async def release(self, child: Child) -> None:
        """Stop a child acquired for a run that never started."""
        await self._stop(child, idle=True)

    async def aclose(self) -> None:
        """Stop every idle child; running ones are stopped by their cancelled runs."""
        self._closed = True
        idle, self._idle = self._idle, []
        for child in idle:
            await self._stop(child, idle=True)
        await anyio.to_thread.run_sync(self.reaper.close)
