"""Module-level typed handlers of the typed-task tests: the sync one runs in a handler
process (a child imports its task by name), the async one in the daemon."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from decimal import Decimal
from typing import Any

from pydantic import BaseModel

import jobsd
from jobsd.registry import Registry

REGISTRY = Registry()
RECEIVED: list[tuple[uuid.UUID, object]] = []
"""(job id, payload) of every run of ``import_csv`` in this process"""


class ImportCsv(BaseModel):
    file: str
    due: dt.datetime
    ref: uuid.UUID
    amount: Decimal = Decimal("0")


# every attempt a retry policy allows: a payload that does not validate takes none
RETRY_ALL = jobsd.RetryPolicy(3, backoff=0, retry_on=(Exception,))


@jobsd.handler("import_csv", retry=RETRY_ALL, registry=REGISTRY)
async def import_csv(ctx: jobsd.JobContext, order: ImportCsv) -> dict[str, Any]:
    """Keep what it was given; report the types."""
    RECEIVED.append((ctx.id, order))
    return {"due": type(order.due).__name__, "ref": type(order.ref).__name__}


@jobsd.handler("import_csv_apart", retry=RETRY_ALL, isolation="process", registry=REGISTRY)
def import_csv_apart(ctx: jobsd.JobContext, order: ImportCsv) -> dict[str, Any]:
    """In a handler process: report the types and values it was given, and its pid."""
    return {
        "types": [type(order.due).__name__, type(order.ref).__name__, type(order.amount).__name__],
        "due": order.due.isoformat(),
        "ref": str(order.ref),
        "amount": str(order.amount),
        "pid": os.getpid(),
    }
