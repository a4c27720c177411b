"""Handlers that run in child processes (``isolation="process"``, issue 11)."""

from __future__ import annotations

import ctypes
import os
import time

from fault_handlers import ledger

import jobsd


@jobsd.handler("hang_isolated", timeout=2.0, isolation="process")
def hang_isolated(ctx: jobsd.JobContext) -> None:
    """Block for good in a child; the timeout must kill the child."""
    ledger().start(ctx.id, ctx.attempt, ctx.type, child=os.getpid())
    time.sleep(10**6)


@jobsd.handler("sleep_isolated", isolation="process")
def sleep_isolated(ctx: jobsd.JobContext) -> None:
    """Sleep 60 s in a child (the daemon is killed meanwhile)."""
    ledger().start(ctx.id, ctx.attempt, ctx.type, child=os.getpid())
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
