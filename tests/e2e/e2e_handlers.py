"""Handlers for the end-to-end tests, loaded by ``python -m jobsd run`` subprocesses.

The daemon imports this module through ``JOBSD_HANDLERS=e2e_handlers`` with this
directory on ``PYTHONPATH``. Side effects go to ``public.e2e_side`` in the daemon's
own database (the test creates it): one row per run, the job id as primary key, so a
job run twice shows up as a failed second run.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import psycopg

import jobsd

BATCH = 100


async def _record_run(job_id: object, attempt: int) -> None:
    """Insert this run into the side table; ride out a database restart."""
    url = os.environ["JOBSD_DATABASE_URL"]
    with anyio.fail_after(60):
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    url, autocommit=True, connect_timeout=3
                ) as conn:
                    await conn.execute(
                        "INSERT INTO e2e_side (job_id, attempt, pid) VALUES (%s, %s, %s)",
                        (job_id, attempt, os.getpid()),
                    )
                return
            except psycopg.errors.UniqueViolation:
                raise
            except psycopg.OperationalError:
                await anyio.sleep(0.1)


@jobsd.handler("noop")
async def noop(ctx: jobsd.JobContext) -> None:
    """Do nothing."""


@jobsd.handler("sleep")
async def sleep(ctx: jobsd.JobContext) -> dict[str, float]:
    """Sleep ``seconds`` (payload), then succeed."""
    seconds = float(ctx.payload.get("seconds", 1.0))
    await anyio.sleep(seconds)
    return {"slept": seconds}


@jobsd.handler("side_effect", max_attempts=3)
async def side_effect(ctx: jobsd.JobContext) -> dict[str, int]:
    """Record this run in the side table, optionally after ``seconds`` of work."""
    seconds = float(ctx.payload.get("seconds", 0.0))
    if seconds:
        await anyio.sleep(seconds)
    await _record_run(ctx.id, ctx.attempt)
    return {"attempt": ctx.attempt}


@jobsd.handler("resumable_import", max_attempts=3)
async def resumable_import(ctx: jobsd.JobContext) -> dict[str, Any]:
    """Import ``rows`` rows in batches, reporting progress; resume from the checkpoint.

    Each batch is recorded in ``e2e_batches`` (its first row is the primary key): a
    batch imported twice after a resume would fail the job.
    """
    total = int(ctx.payload.get("rows", 2000))
    delay_s = float(ctx.payload.get("delay_s", 0.05))
    done = int(ctx.checkpoint.get("done", 0))
    resumed_from = done
    url = os.environ["JOBSD_DATABASE_URL"]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while done < total:
            batch = min(BATCH, total - done)
            await anyio.sleep(delay_s)
            # the batch and its checkpoint are not atomic: a crash between them makes the
            # next attempt redo one batch, which the ON CONFLICT below tolerates
            await conn.execute(
                "INSERT INTO e2e_batches (first_row, job_id, attempt) VALUES (%s, %s, %s) "
                "ON CONFLICT (first_row) DO UPDATE SET redone = e2e_batches.redone + 1",
                (done, ctx.id, ctx.attempt),
            )
            done += batch
            await ctx.progress(done=done, total=total)
    return {"rows": total, "resumed_from": resumed_from, "attempt": ctx.attempt}


@jobsd.handler("always_fails")
async def always_fails(ctx: jobsd.JobContext) -> None:
    """Fail with the payload's message."""
    raise RuntimeError(ctx.payload.get("message", "this job always fails"))


@jobsd.handler("slow_first_run", max_attempts=2)
async def slow_first_run(ctx: jobsd.JobContext) -> dict[str, int]:
    """Hang on the first attempt (the test kills the daemon meanwhile); succeed after."""
    await _record_run_attempt(ctx.id, ctx.attempt)
    if ctx.attempt == 1:
        await anyio.sleep(3600)
    return {"attempt": ctx.attempt}


@jobsd.handler("publish_once", delivery="at_most_once", max_attempts=3)
async def publish_once(ctx: jobsd.JobContext) -> dict[str, int]:
    """Hang (the test kills the daemon meanwhile): an at_most_once job never runs twice."""
    await _record_run_attempt(ctx.id, ctx.attempt)
    await anyio.sleep(3600)
    return {"attempt": ctx.attempt}


async def _record_run_attempt(job_id: object, attempt: int) -> None:
    url = os.environ["JOBSD_DATABASE_URL"]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO e2e_runs (job_id, attempt, pid) VALUES (%s, %s, %s)",
            (job_id, attempt, os.getpid()),
        )


@jobsd.handler("whoami", max_attempts=2)
async def whoami(ctx: jobsd.JobContext) -> dict[str, int]:
    """Work ``seconds`` (payload), then report which process did it."""
    await anyio.sleep(float(ctx.payload.get("seconds", 1.0)))
    return {"pid": os.getpid(), "attempt": ctx.attempt}
