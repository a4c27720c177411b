"""Handlers of the fault campaign, loaded by ``python -m jobsd run`` subprocesses.

Each run appends to the ground-truth ledger (``ledger.py``), a file outside jobsd's
tables whose path is in ``JOBSD_FAULTS_LEDGER``: a ``start`` line before the work (the
side effect an at-most-once job must never repeat) and an ``end`` line after it, with
the outcome (``ok``, ``cancelled``, ``error``). A process killed mid-job leaves a start
without an end.

Types: ``work`` retries (at_least_once, 3 attempts), ``once`` never runs twice
(at_most_once), both sleep ``ms`` milliseconds (payload); ``hang_async`` waits forever
under a 2 s timeout.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio
from ledger import Ledger

import jobsd
from jobsd import RetryPolicy

_ledger: Ledger | None = None
WORK_ATTEMPTS = 3


def ledger() -> Ledger:
    """Return this process's ledger writer (opened on first use)."""
    global _ledger
    if _ledger is None:
        _ledger = Ledger(os.environ["JOBSD_FAULTS_LEDGER"])
    return _ledger


async def _run(ctx: jobsd.JobContext, work: Any) -> dict[str, int]:
    book = ledger()
    book.start(ctx.id, ctx.attempt, ctx.type)
    outcome = "error"
    try:
        await work()
        outcome = "ok"
    except anyio.get_cancelled_exc_class():
        outcome = "cancelled"
        raise
    finally:
        book.end(ctx.id, ctx.attempt, ctx.type, outcome)
    return {"attempt": ctx.attempt, "pid": os.getpid()}


async def _sleep_ms(ctx: jobsd.JobContext) -> None:
    await anyio.sleep(float(ctx.payload.get("ms", 50)) / 1000)


@jobsd.handler("work", max_attempts=WORK_ATTEMPTS)
async def work(ctx: jobsd.JobContext) -> dict[str, int]:
    """Sleep ``ms`` (retryable: at_least_once, 3 attempts)."""
    return await _run(ctx, lambda: _sleep_ms(ctx))


@jobsd.handler("once", delivery="at_most_once")
async def once(ctx: jobsd.JobContext) -> dict[str, int]:
    """Sleep ``ms`` (at_most_once: never run again after its owner is lost)."""
    return await _run(ctx, lambda: _sleep_ms(ctx))


@jobsd.handler("hang_async", timeout=2.0)
async def hang_async(ctx: jobsd.JobContext) -> dict[str, int]:
    """Wait forever; the type's 2 s timeout must end it."""
    return await _run(ctx, lambda: anyio.Event().wait())


@jobsd.handler(
    "hang_async_retry", timeout=2.0, retry=RetryPolicy(2, backoff=0.2, retry_on=(TimeoutError,))
)
async def hang_async_retry(ctx: jobsd.JobContext) -> dict[str, int]:
    """Wait forever; timed out twice (retried once), then failed."""
    return await _run(ctx, lambda: anyio.Event().wait())


@jobsd.handler("boom", max_attempts=1)
async def boom(ctx: jobsd.JobContext) -> None:
    """Raise MemoryError (an out-of-memory handler): that job alone fails."""
    ledger().start(ctx.id, ctx.attempt, ctx.type)
    ledger().end(ctx.id, ctx.attempt, ctx.type, "error")
    raise MemoryError("simulated out of memory")


@jobsd.handler("flaky", retry=RetryPolicy(3, backoff=4.0, retry_on=(RuntimeError,)))
async def flaky(ctx: jobsd.JobContext) -> dict[str, int]:
    """Fail the first attempt after 1.5 s (heartbeated meanwhile); retried 4 s later
    (longer than the lease), the next attempt works 2 s and succeeds."""

    async def attempt() -> None:
        if ctx.attempt == 1:
            await anyio.sleep(1.5)
            raise RuntimeError("first attempt fails")
        await anyio.sleep(2.0)

    return await _run(ctx, attempt)


@jobsd.handler("hang_sync", timeout=2.0, delivery="at_most_once", isolation="none")
def hang_sync(ctx: jobsd.JobContext) -> None:
    """Block a thread of the daemon for good; its 2 s timeout cannot stop it (the job
    becomes recovery_required, never failed while the thread runs)."""
    ledger().start(ctx.id, ctx.attempt, ctx.type)
    time.sleep(10**6)
