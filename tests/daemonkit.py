"""Helpers shared by the service, HTTP and security tests: an in-process daemon and a
poll with a deadline (never a bare sleep)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import TypeVar

import anyio

from jobsd.registry import Registry
from jobsd.settings import Settings
from jobsd.worker.supervisor import Daemon

T = TypeVar("T")


@asynccontextmanager
async def running_daemon(settings: Settings, registry: Registry) -> AsyncIterator[Daemon]:
    """Run a daemon in the current event loop; stop it gracefully on exit.

    The daemon is built inside the running loop, as it must be. Leaving the block waits
    until it has written every outcome and closed its pool.
    """
    async with anyio.create_task_group() as tg:
        daemon = Daemon(settings, registry)
        tg.start_soon(partial(daemon.run, handle_signals=False), name="daemon")
        try:
            with anyio.fail_after(15):
                await daemon.ready.wait()
            yield daemon
        finally:
            daemon.stop()


async def wait_until(
    check: Callable[[], Awaitable[T | None]], *, what: str, timeout_s: float = 10.0
) -> T:
    """Poll ``check`` (every 20 ms) until it returns a truthy value; fail after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await anyio.sleep(0.02)
