"""The loop every service runs, its one jitter formula and its one outage policy.

A service is a pass (``run_once``) repeated by ``run_loop``: pass, wait, pass again.
The wait is the service's own: a jittered pause (``pause``) for timed services, a
mailbox or a wake-up for the others.

Outage policy, the same for every service: a pass that fails because the database is
away (``BackendUnavailable``: refused, dropped, or no pooled connection in time) is
run again, from the top, after the shared back-off of ``store.retries.transient_retries``
(exponential from 50 ms up to 5 s, plus up to 200 ms of jitter), for as long as it
takes, with a ``db.retrying`` warning per retry. The back-off starts over after a pass
that succeeds. No other error is retried: it ends the service, and the daemon with it.
A service that holds a connection (listener, lifeline) drops it when it fails; the
retried pass reconnects.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

import anyio
from anyio.abc import TaskStatus

from jobsd.errors import BackendUnavailable
from jobsd.store.retries import transient_retries
from jobsd.worker.clock import Clock

__all__ = ["jitter", "pause", "run_loop", "through_outage"]

T = TypeVar("T")


def jitter(interval_s: float) -> float:
    """Return a wait of about ``interval_s``: uniformly 2/3 to 4/3 of it.

    Daemons started together drift apart instead of polling in step.
    """
    return interval_s * random.uniform(2 / 3, 4 / 3)


def pause(interval_s: float, clock: Clock) -> Callable[[], Awaitable[None]]:
    """Return the wait of a timed service: a jittered ``interval_s`` on ``clock``."""

    async def wait() -> None:
        await clock.sleep(jitter(interval_s))

    return wait


async def through_outage(operation: str, step: Callable[[], Awaitable[T]], clock: Clock) -> T:
    """Run ``step``; while the database is away, run it again after the shared back-off."""
    try:
        # the fast path builds no retry machinery: most passes succeed
        return await step()
    except BackendUnavailable as exc:
        failed: BackendUnavailable | None = exc
    async for attempt in transient_retries(operation, sleep=clock.sleep):
        with attempt:
            if failed is not None:
                # the first failure, fed to tenacity so that it logs and backs off
                first, failed = failed, None
                raise first
            return await step()
    raise AssertionError("unreachable: transient_retries never stops")


async def run_loop(
    operation: str,
    step: Callable[[], Awaitable[object]],
    wait: Callable[[], Awaitable[object]],
    clock: Clock,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    started_after_first_pass: bool = False,
    aclose: Callable[[], Awaitable[object]] | None = None,
) -> NoReturn:
    """Run ``step`` through outages, then ``wait``, until cancelled; the first pass at once.

    ``task_status`` is reported started at once, or once the first pass succeeded
    (for services the others must not start without: the listener, the lifeline).
    ``aclose`` runs on the way out, shielded (a held connection is closed).
    """
    try:
        if not started_after_first_pass:
            task_status.started()
        while True:
            await through_outage(operation, step, clock)
            if started_after_first_pass:
                started_after_first_pass = False
                task_status.started()
            await wait()
    finally:
        if aclose is not None:
            with anyio.CancelScope(shield=True):
                await aclose()
