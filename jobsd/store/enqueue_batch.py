"""Enqueue a batch of one type from plain payloads: ids in, ids out, no object per job.

A batch of ``BATCH_COPY_MIN_JOBS`` jobs or more without a start time goes in through
one autocommit ``COPY``, its rows written by the client in COPY's text format in one
string; a smaller one, one with a start time, or one on a role under row-level
security (where COPY FROM does not run) goes in through one ``INSERT`` over arrays.
Either is all or nothing, and its insert triggers (admission, wake-up) run as for any
enqueue.
"""

from __future__ import annotations

import uuid

import psycopg

from jobsd.ids import uuid_of_int
from jobsd.jobspec import BatchSpec
from jobsd.store.db import AsyncPool, acquire, db_errors
from jobsd.store.enqueue import COPY_REFUSED
from jobsd.store.named import run_named_tuples, sql_text

__all__ = ["BATCH_COPY_MIN_JOBS", "enqueue_batch"]

# From this many jobs COPY pays for its second round trip (measured: bench/bench.py).
BATCH_COPY_MIN_JOBS = 64


async def enqueue_batch(pool: AsyncPool, batch: BatchSpec) -> list[uuid.UUID]:
    """Insert a checked batch; return its jobs' ids in order."""
    ids = [uuid_of_int(i) for i in batch.ids]
    if not ids:
        return ids
    async with acquire(pool, batch.operation) as conn:
        with db_errors(batch.operation):
            if (
                len(ids) >= BATCH_COPY_MIN_JOBS
                and batch.run_after is None
                and conn not in COPY_REFUSED
            ):
                try:
                    async with (
                        conn.cursor() as cursor,
                        cursor.copy(sql_text("jobs_copy_batch")) as copy,
                    ):
                        await copy.write(copy_text(batch))
                    return ids
                except psycopg.errors.FeatureNotSupported:
                    # row-level security applies to this role: COPY FROM refuses, the
                    # statement did nothing
                    COPY_REFUSED.add(conn)
            await run_named_tuples(
                conn,
                "jobs_insert_batch",
                {
                    "ids": ids,
                    "payloads": batch.payload_texts,
                    "org_id": batch.org_id,
                    "type": batch.type,
                    "queue": batch.queue,
                    "priority": batch.priority,
                    "run_after": batch.run_after,
                    "trace_context": batch.trace_context,
                },
            )
    return ids


def copy_text(batch: BatchSpec) -> str:
    """Return the batch's rows in COPY's text format, in ``jobs_copy_batch``'s columns.

    The payloads come from jobsd's JSON encoder, which writes every control character
    as an escape: a backslash is the only character COPY's text format needs escaped.
    """
    trace = "\\N" if batch.trace_context is None else _escaped(batch.trace_context)
    same = (
        f"\t{_escaped(batch.org_id)}\t{_escaped(batch.type)}\t{_escaped(batch.queue)}"
        f"\t{batch.priority}\t{trace}\t"
    )
    return "".join(
        [
            f"{i:032x}{same}{p.replace(chr(92), chr(92) * 2) if chr(92) in p else p}\n"
            for i, p in zip(batch.ids, batch.payload_texts, strict=True)
        ]
    )


def _escaped(text: str) -> str:
    """Escape a value for COPY's text format: backslash, and the characters it uses
    between values and rows."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
