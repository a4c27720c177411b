"""Enqueue cases: Postgres alone (floor), one per call, bulk, concurrent, and pgbench."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import partial

import anyio
import anyio.to_thread
import psycopg
from measure import ORG, TYPE, Rate, Sizes, case_db, client_for, enqueue_bulk, onoff
from probe import WaitSampler
from server import BenchServer

import jobsd
from jobsd.store.sqlfiles import load_queries

__all__ = [
    "case_bulk",
    "case_concurrent",
    "case_floor",
    "case_server_side",
    "case_single",
]


async def case_floor(server: BenchServer, sizes: Sizes) -> list[Rate]:
    """Measure Postgres alone: a SELECT 1 round trip; an autocommit one-row INSERT."""
    n = sizes.floor
    async with case_db(server, "floor") as (url, meter):
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        async with conn:
            await conn.execute("CREATE TABLE bench_floor (id bigserial PRIMARY KEY, v jsonb)")
            for _ in range(sizes.warmup):
                await conn.execute("SELECT 1")
                await conn.execute("INSERT INTO bench_floor (v) VALUES (%s)", ('{"i": -1}',))
            await meter.start()
            for _ in range(n):
                await conn.execute("SELECT 1")
            select = await meter.stop(Rate("floor: `SELECT 1` round trip", "-", n))
            await meter.start()
            for i in range(n):
                await conn.execute("INSERT INTO bench_floor (v) VALUES (%s)", (f'{{"i": {i}}}',))
            insert = await meter.stop(Rate("floor: bare one-row INSERT, autocommit", "-", n))
    return [select, insert]


async def case_single(server: BenchServer, sizes: Sizes, notify: bool) -> Rate:
    """Enqueue one job per call, sequentially, on one client."""
    rate = Rate("enqueue, one job per call", onoff(notify), sizes.single)
    async with (
        case_db(server, "single", notify=notify) as (url, meter),
        client_for(url) as client,
    ):
        for i in range(sizes.warmup):
            await client.enqueue(TYPE, {"i": -i}, org_id=ORG)
        await meter.start()
        for i in range(sizes.single):
            await client.enqueue(TYPE, {"i": i}, org_id=ORG)
        return await meter.stop(rate)


async def case_bulk(server: BenchServer, sizes: Sizes, notify: bool) -> Rate:
    """Enqueue with enqueue_many, ``bulk_batch`` jobs per call."""
    rate = Rate(f"enqueue, bulk ({sizes.bulk_batch:,} per call)", onoff(notify), sizes.bulk)
    async with (
        case_db(server, "bulk", notify=notify) as (url, meter),
        client_for(url) as client,
    ):
        await enqueue_bulk(client, sizes.bulk_batch, sizes.bulk_batch, start=-sizes.bulk_batch)
        await meter.start()
        await enqueue_bulk(client, sizes.bulk, sizes.bulk_batch)
        return await meter.stop(rate)


async def case_concurrent(server: BenchServer, sizes: Sizes, notify: bool) -> Rate:
    """Run ``enqueuers`` tasks of single enqueues at once, one pool connection each."""
    k = sizes.enqueuers
    per = sizes.concurrent // k
    rate = Rate(f"enqueue, one per call, {k} concurrent tasks", onoff(notify), per * k)

    async def enqueuer(client: jobsd.Client, base: int, count: int) -> None:
        for i in range(base, base + count):
            await client.enqueue(TYPE, {"i": i}, org_id=ORG)

    async with (
        case_db(server, "concurrent", notify=notify) as (url, meter),
        client_for(url, pool_size=k) as client,
    ):
        async with anyio.create_task_group() as tg:  # warm-up; grows the pool to k
            for w in range(k):
                tg.start_soon(enqueuer, client, -(w + 1) * 1000, max(sizes.warmup // 2, 10))
        sampler = WaitSampler(url, "jobsd-client")
        await meter.start()
        async with sampler.running(), anyio.create_task_group() as tg:
            for w in range(k):
                tg.start_soon(enqueuer, client, w * per, per)
        rate = await meter.stop(rate)
        rate.note = sampler.summary()
        size = client._pool.get_stats().get("pool_size", k)
        if size < k:
            rate.note += f"; pool reached only {size} connections"
        return rate


def _pgbench_script() -> str:
    """Return jobsd's own single-job INSERT with the parameters as literals."""
    text = load_queries()["jobs_insert"]
    for name, literal in {
        "id": "jobsd.uuidv7()",
        "org_id": f"'{ORG}'",
        "type": f"'{TYPE}'",
        "queue": "'default'",
        "dedup_key": "NULL",
        "payload": "'{\"i\": 1}'",
        "run_after": "NULL",
        "priority": "0",
        "concurrency_key": "NULL",
        "trace_context": "NULL",
        "blocked": "false",
    }.items():
        text = text.replace(f"%({name})s", literal)
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    return "\n".join(lines).strip() + "\n"


def pgbench_path(server: BenchServer) -> str | None:
    """Find pgbench next to the server binaries, else on PATH."""
    if server.bindir is not None and (server.bindir / "pgbench").is_file():
        return str(server.bindir / "pgbench")
    return shutil.which("pgbench")


async def case_server_side(server: BenchServer, sizes: Sizes, notify: bool) -> Rate:
    """Run jobsd's INSERT from pgbench (C, 8 clients): Postgres alone, no Python client."""
    k = sizes.enqueuers
    rate = Rate(f"server side: jobsd's INSERT from pgbench, {k} clients", onoff(notify), 0)
    exe = pgbench_path(server)
    if exe is None:
        rate.note = "pgbench not found"
        return rate
    async with case_db(server, "pgbench", notify=notify) as (url, meter):
        with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
            script.write(_pgbench_script())
            script.flush()
            base = [exe, "-n", "-M", "prepared", "-c", str(k), "-j", "2", "-f", script.name]
            run = partial(subprocess.run, capture_output=True, text=True, check=True)
            await anyio.to_thread.run_sync(run, [*base, "-t", "20", url])  # warm-up
            sampler = WaitSampler(url, "pgbench")
            await meter.start()
            async with sampler.running():
                timed = [*base, "-T", str(sizes.server_side_s), url]
                done = await anyio.to_thread.run_sync(run, timed)
            rate = await meter.stop(rate)
            rate.note = sampler.summary()
    for line in done.stdout.splitlines():
        if line.startswith("number of transactions actually processed:"):
            rate.n = int(line.split(":")[1].split("/")[0])
    return rate
