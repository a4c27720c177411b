"""Handlers that log through the application's own logger, for the log-context tests.

Loaded by ``jobsd run`` with ``JOBSD_HANDLERS=log_handlers``. Each logs ``sending
mail`` on the ``myapp`` logger, with the process id, as an application's handler
would: jobsd's filter adds the job's fields. The module logs once when imported: in
the daemon that is before any run.
"""

from __future__ import annotations

import logging
import os
import threading

import jobsd

log = logging.getLogger("myapp")
log.info("handlers.loaded", extra={"pid": os.getpid()})


def _mail(ctx: jobsd.JobContext) -> None:
    log.info(
        "sending mail",
        extra={
            "pid": os.getpid(),
            "thread_name": threading.current_thread().name,
            "n": ctx.payload.get("n"),
        },
    )


@jobsd.handler("log.async")
async def log_async(ctx: jobsd.JobContext) -> None:
    """Log from the daemon's event loop."""
    _mail(ctx)


@jobsd.handler("log.flaky", retry=jobsd.RetryPolicy(2, backoff=0))
async def log_flaky(ctx: jobsd.JobContext) -> None:
    """Log, and fail the first attempt (the retry logs its own attempt)."""
    _mail(ctx)
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")


@jobsd.handler("log.sync", isolation="none")
def log_sync(ctx: jobsd.JobContext) -> None:
    """Log from a thread of the daemon."""
    _mail(ctx)


@jobsd.handler("log.isolated", isolation="process")
def log_isolated(ctx: jobsd.JobContext) -> None:
    """Log from a handler process."""
    _mail(ctx)
