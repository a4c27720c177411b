"""Handlers that run in handler processes: sync ones under the default isolation, the
crashing ones said explicitly (``isolation="process"``)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import time

from fault_handlers import ledger

import jobsd


def _start_tools(ctx: jobsd.JobContext) -> list[int]:
    """Start two tools as handlers do: a ``sleep`` and a shell that forks one more
    (``sleep & sleep``). Return their pids (the shell's fork is found by the test)."""
    tool = subprocess.Popen(["sleep", "60"])
    shell = subprocess.Popen(["sh", "-c", "sleep 61 & sleep 62; wait"])
    return [tool.pid, shell.pid]


@jobsd.handler("hang_isolated", timeout=2.0)
def hang_isolated(ctx: jobsd.JobContext) -> None:
    """Start tools, then block for good in a handler process (the default for a sync
    handler); the timeout must kill the process and its tools."""
    tools = _start_tools(ctx)
    ledger().start(ctx.id, ctx.attempt, ctx.type, child=os.getpid(), tools=tools)
    time.sleep(10**6)


@jobsd.handler("sleep_isolated")
def sleep_isolated(ctx: jobsd.JobContext) -> None:
    """Start tools, then sleep 60 s in a handler process (the daemon is killed
    meanwhile)."""
    tools = _start_tools(ctx)
    ledger().start(ctx.id, ctx.attempt, ctx.type, child=os.getpid(), tools=tools)
    time.sleep(60)


@jobsd.handler("crash_abort", isolation="process")
def crash_abort(ctx: jobsd.JobContext) -> None:
    """Die of SIGABRT."""
    ledger().start(ctx.id, ctx.attempt, ctx.type, child=os.getpid())
    os.abort()


@jobsd.handler("crash_exit", isolation="process")
def crash_exit(ctx: jobsd.JobContext) -> None:
    """Exit with status 3 without cleaning up."""
    ledger().start(ctx.id, ctx.attempt, ctx.type, child=os.getpid())
    os._exit(3)


@jobsd.handler("crash_segv", isolation="process")
def crash_segv(ctx: jobsd.JobContext) -> None:
    """Read address 0: SIGSEGV."""
    ledger().start(ctx.id, ctx.attempt, ctx.type, child=os.getpid())
    ctypes.string_at(0)
