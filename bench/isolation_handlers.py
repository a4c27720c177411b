"""No-op handlers for bench/isolation.py: module-level, so a child process imports them."""

from __future__ import annotations

import jobsd
from jobsd.registry import Registry

REGISTRY = Registry()


@jobsd.handler("noop_inline", isolation="none", registry=REGISTRY)
def noop_inline(ctx: jobsd.JobContext) -> dict[str, int]:
    """Return at once, in a thread of the daemon."""
    return {"n": ctx.payload["n"]}


@jobsd.handler("noop_isolated", isolation="process", registry=REGISTRY)
def noop_isolated(ctx: jobsd.JobContext) -> dict[str, int]:
    """Return at once, in a child process."""
    return {"n": ctx.payload["n"]}
