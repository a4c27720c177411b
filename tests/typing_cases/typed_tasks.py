"""A user's module, checked by ``mypy --strict`` in tests/unit/test_typed_tasks_typing.py.

Each line whose comment starts with "error" must be reported, with the rest of the
comment in the message; no other line may be.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import psycopg
from pydantic import BaseModel

import jobsd


class ImportCsv(BaseModel):
    file: str
    due: dt.datetime


class Other(BaseModel):
    name: str


@jobsd.handler("import_csv", max_attempts=3)
async def import_csv(ctx: jobsd.JobContext, order: ImportCsv) -> dict[str, int]:
    return {"rows": len(order.file)}


@jobsd.handler("map_reconcile")
def map_reconcile(ctx: jobsd.JobContext) -> None:
    print(ctx.payload)


NOW = dt.datetime.now(dt.UTC)


async def correct(
    client: jobsd.Client, sync: jobsd.SyncClient, conn: psycopg.AsyncConnection[Any]
) -> jobsd.Job:
    job = await import_csv.enqueue(ImportCsv(file="a.csv", due=NOW), org_id="acme")
    await import_csv.enqueue({"file": "a.csv"}, priority=3, client=client, conn=conn)
    import_csv.enqueue_sync(ImportCsv(file="a.csv", due=NOW), client=sync, queue="imports")
    map_reconcile.enqueue_sync({"target_id": 3}, job_id=uuid.uuid4(), dedup_key="m:3")
    await jobsd.enqueue("import_csv", ImportCsv(file="a.csv", due=NOW))
    task: jobsd.Task[ImportCsv] = import_csv
    print(task.type, task.model)
    return job


async def wrong(client: jobsd.Client, sync: jobsd.SyncClient) -> None:
    await import_csv.enqueue(Other(name="x"))  # error: incompatible type "Other"
    await import_csv.enqueue({"file": "a.csv"}, priorty=3)  # error: "priorty"
    await import_csv.enqueue(ImportCsv(file="a", due=NOW), client=sync)  # error: "SyncClient"
    import_csv.enqueue_sync({"file": "a.csv"}, client=client)  # error: "Client"
    map_reconcile.enqueue_sync(ImportCsv(file="a", due=NOW))  # error: incompatible type
    other: jobsd.Task[Other] = import_csv  # error: "Task[ImportCsv]"
    print(other)
