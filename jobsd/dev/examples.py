"""Example handlers that `jobsd dev` loads (``JOBSD_HANDLERS=jobsd.dev.examples``).

``import_csv`` is shaped like a real import: it reports progress per batch, saves a
checkpoint, and resumes from it when a later attempt runs after a crash.
"""

from __future__ import annotations

import random
import time
from typing import Any

import anyio

import jobsd
from jobsd.models import Job

BATCH = 100


def _import_failed(job: Job) -> None:
    print(f"on_fail: import {job.id} failed: {job.error}")


@jobsd.handler("import_csv", max_attempts=3, dedup_scope="queue", on_fail=_import_failed)
async def import_csv(ctx: jobsd.JobContext) -> dict[str, Any]:
    """Pretend to import ``rows`` CSV rows (default 2000), in batches, resumably.

    Payload: ``{"rows": 2000, "bad_every": 0, "delay_s": 0.05}``; every ``bad_every``-th
    row is counted as an error. Kill the daemon mid-run and the next attempt starts
    from the last checkpoint, not from row 0.
    """
    total = int(ctx.payload.get("rows", 2000))
    bad_every = int(ctx.payload.get("bad_every", 0))
    delay_s = float(ctx.payload.get("delay_s", 0.05))
    done = int(ctx.checkpoint.get("done", 0))
    inserted = int(ctx.checkpoint.get("inserted", 0))
    errors = int(ctx.checkpoint.get("errors", 0))
    resumed_from = done
    while done < total:
        batch = min(BATCH, total - done)
        for row in range(done, done + batch):
            if bad_every and (row + 1) % bad_every == 0:
                errors += 1
            else:
                inserted += 1
        done += batch
        await anyio.sleep(delay_s)
        await ctx.progress(done=done, total=total, inserted=inserted, errors=errors)
    return {
        "read": total,
        "inserted": inserted,
        "ignored": 0,
        "errors": errors,
        "resumed_from": resumed_from,
        "attempt": ctx.attempt,
    }


@jobsd.handler("map_reconcile", dedup_scope="queue")
def map_reconcile(ctx: jobsd.JobContext) -> dict[str, Any]:
    """Reconcile a map (sync handler: runs in a worker thread)."""
    time.sleep(random.uniform(0.01, 0.1))
    return {"target": ctx.payload.get("target_id"), "reconciled": True}


@jobsd.handler("noop")
async def noop(ctx: jobsd.JobContext) -> None:
    """Do nothing (for benchmarks)."""


@jobsd.handler("always_fails")
async def always_fails(ctx: jobsd.JobContext) -> None:
    """Fail, to show a failed job's cause."""
    raise RuntimeError(ctx.payload.get("message", "this job always fails"))
