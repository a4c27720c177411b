"""An in-process daemon for the service, HTTP and security tests, and its fast settings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio

from jobsd.registry import Registry
from jobsd.settings import Settings
from jobsd.worker.supervisor import Daemon

# short intervals: a scenario takes well under a second of daemon time, without
# spinning the machine's two cores
DAEMON_FAST: dict[str, Any] = {
    "slots": 4,
    "poll_interval": 0.5,
    "heartbeat_interval": 0.2,
    "progress_interval": 0.05,
    "sweep_interval": 3600.0,
    # ended jobs stay in the hot table, where a test's own SQL looks for them; the
    # archive's tests set their own
    "archive_after": 3600.0,
    "drain_timeout": 2.0,
    "handlers": [],
    "queues": [],
}


def fast_settings(db_url: str, **overrides: Any) -> Settings:
    """Return core settings for ``db_url`` with the fast test intervals."""
    return Settings(database_url=db_url, **{**DAEMON_FAST, **overrides})


@asynccontextmanager
async def running_daemon(
    settings: Settings, registry: Registry, **daemon_args: Any
) -> AsyncIterator[Daemon]:
    """Run a daemon in the current event loop; stop it gracefully on exit.

    The daemon is built inside the running loop, as it must be. Leaving the block waits
    until it has written every outcome and closed its pool.
    """
    async with anyio.create_task_group() as tg:
        daemon = Daemon(settings, registry, **daemon_args)
        tg.start_soon(partial(daemon.run, handle_signals=False), name="daemon")
        try:
            with anyio.fail_after(15):
                await daemon.ready.wait()
            yield daemon
        finally:
            daemon.stop()
