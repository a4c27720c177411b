"""Handlers for bench/isolation.py: module-level, so a child process imports them.

Each type is one place a handler runs, under the daemon's default isolation (``auto``)
unless it says: ``async_*`` in the event loop, ``sync_*`` in a handler process,
``thread_*`` in a thread of the daemon. ``*_noop`` returns at once, ``*_10ms`` works
10 ms (a sleep: the cost of the place, not of the CPU).
"""

from __future__ import annotations

import time

import anyio

import jobsd
from jobsd.registry import Registry

REGISTRY = Registry()


@jobsd.handler("async_noop", registry=REGISTRY)
async def async_noop(ctx: jobsd.JobContext) -> dict[str, int]:
    """Return at once, in the event loop."""
    return {"n": ctx.payload["n"]}


@jobsd.handler("async_10ms", registry=REGISTRY)
async def async_10ms(ctx: jobsd.JobContext) -> dict[str, int]:
    """Wait 10 ms in the event loop."""
    await anyio.sleep(0.01)
    return {"n": ctx.payload["n"]}


@jobsd.handler("sync_noop", registry=REGISTRY)
def sync_noop(ctx: jobsd.JobContext) -> dict[str, int]:
    """Return at once, in a handler process (the default for sync handlers)."""
    return {"n": ctx.payload["n"]}


@jobsd.handler("sync_10ms", registry=REGISTRY)
def sync_10ms(ctx: jobsd.JobContext) -> dict[str, int]:
    """Wait 10 ms in a handler process."""
    time.sleep(0.01)
    return {"n": ctx.payload["n"]}


@jobsd.handler("thread_noop", isolation="none", registry=REGISTRY)
def thread_noop(ctx: jobsd.JobContext) -> dict[str, int]:
    """Return at once, in a thread of the daemon."""
    return {"n": ctx.payload["n"]}


@jobsd.handler("thread_10ms", isolation="none", registry=REGISTRY)
def thread_10ms(ctx: jobsd.JobContext) -> dict[str, int]:
    """Wait 10 ms in a thread of the daemon."""
    time.sleep(0.01)
    return {"n": ctx.payload["n"]}


@jobsd.handler("sync_until_cancelled", registry=REGISTRY)
def sync_until_cancelled(ctx: jobsd.JobContext) -> None:
    """Say it runs, then block in a handler process until killed."""
    ctx.progress(running=True)
    time.sleep(3600)


@jobsd.handler("async_until_cancelled", registry=REGISTRY)
async def async_until_cancelled(ctx: jobsd.JobContext) -> None:
    """Say it runs, then wait in the event loop until cancelled."""
    await ctx.progress(running=True)
    await anyio.sleep(3600)
