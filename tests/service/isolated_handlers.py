"""Module-level handlers for the isolation tests: a child process imports them by name."""

from __future__ import annotations

import ctypes
import os
import signal
import time

import anyio

import jobsd
from jobsd.recovery import Recovery, succeeded
from jobsd.registry import Registry

REGISTRY = Registry()


@jobsd.handler("iso_work", isolation="process", registry=REGISTRY)
async def iso_work(ctx: jobsd.JobContext) -> dict[str, object]:
    """Report progress twice, then return the payload's number doubled and the child pid."""
    await ctx.progress(done=1, total=2)
    await anyio.sleep(0.05)
    await ctx.progress(done=2, total=2)
    return {"doubled": ctx.payload["n"] * 2, "pid": os.getpid()}


@jobsd.handler("iso_sync", isolation="process", registry=REGISTRY)
def iso_sync(ctx: jobsd.JobContext) -> dict[str, object]:
    """A sync handler in a child."""
    print("a print goes to stderr, not into the protocol")
    return {"pid": os.getpid(), "attempt": ctx.attempt}


@jobsd.handler("iso_segv", isolation="process", registry=REGISTRY)
def iso_segv(ctx: jobsd.JobContext) -> None:
    """Read address 0: SIGSEGV."""
    ctypes.string_at(0)


@jobsd.handler(
    "iso_raise",
    isolation="process",
    retry=jobsd.RetryPolicy(2, backoff=0.01, retry_on=(LookupError,)),
    registry=REGISTRY,
)
def iso_raise(ctx: jobsd.JobContext) -> None:
    """Raise a KeyError (a LookupError: retried once by the policy)."""
    raise KeyError(f"attempt {ctx.attempt}")


@jobsd.handler("iso_hang", isolation="process", timeout=0.5, registry=REGISTRY)
def iso_hang(ctx: jobsd.JobContext) -> None:
    """Say which process runs it, then block for good: the timeout kills the child."""
    ctx.progress(pid=os.getpid())
    time.sleep(10**6)


@jobsd.handler("iso_stubborn", isolation="process", timeout=0.5, registry=REGISTRY)
def iso_stubborn(ctx: jobsd.JobContext) -> None:
    """Ignore SIGTERM, then block: only the SIGKILL after the grace ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ctx.progress(pid=os.getpid())
    time.sleep(10**6)


@jobsd.handler("iso_big", isolation="process", registry=REGISTRY)
def iso_big(ctx: jobsd.JobContext) -> dict[str, str]:
    """Return a report larger than the test's cap."""
    return {"blob": "x" * int(ctx.payload["size"])}


def _published(job: jobsd.Job) -> Recovery:
    """The child published before it died: the recover hook says so."""
    return succeeded({"found": "published"})


@jobsd.handler(
    "iso_publish_crash",
    isolation="process",
    delivery="at_most_once",
    recover=_published,
    registry=REGISTRY,
)
def iso_publish_crash(ctx: jobsd.JobContext) -> None:
    """Publish, then die before returning: a lost child of an at_most_once type."""
    os._exit(9)


@jobsd.handler("big_inline", isolation="none", registry=REGISTRY)
async def big_inline(ctx: jobsd.JobContext) -> dict[str, str]:
    """Return a report larger than the test's cap, in the daemon."""
    return {"blob": "x" * 5000}


@jobsd.handler("follows_default", registry=REGISTRY)
def follows_default(ctx: jobsd.JobContext) -> dict[str, int]:
    """No isolation of its own: JOBSD_ISOLATION decides."""
    return {"pid": os.getpid()}
