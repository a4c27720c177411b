"""The daemon's back-off on an unreachable database: retry forever, never crash."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_never,
    wait_exponential,
    wait_random,
)

from jobsd.errors import BackendUnavailable

__all__ = ["transient_retries"]

log = logging.getLogger("jobsd.store.db")


def transient_retries(
    operation: str,
    *,
    max_wait_s: float = 5.0,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> AsyncRetrying:
    """Retry a block forever on BackendUnavailable, backing off up to ``max_wait_s``.

    For the daemon's own loops: the database going away must never crash it. ``sleep``
    waits out the back-off (the daemon passes its clock's); None is anyio's.
    """

    def _log(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "db.retrying",
            extra={"operation": operation, "attempt": state.attempt_number, "error": str(exc)},
        )

    return AsyncRetrying(
        retry=retry_if_exception_type(BackendUnavailable),
        # exponential from 50 ms up to max_wait_s, plus up to 200 ms of jitter
        wait=wait_exponential(multiplier=0.05, max=max_wait_s) + wait_random(0, 0.2),
        stop=stop_never,
        before_sleep=_log,
        reraise=True,
        sleep=sleep if sleep is not None else anyio.sleep,
    )
