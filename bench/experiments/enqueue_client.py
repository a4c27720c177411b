"""Scratch: where the Python client's CPU goes per ``Client.enqueue``.

    uv run --group bench --with orjson --with msgspec python \
        bench/experiments/enqueue_client.py [--database-url URL] [--n 3000] [--profile]

Times (process CPU per call, median of 3) the whole call and its parts in isolation:
building the spec (checks, JSON, uuid7), the pool checkout, the statement with its row
decoding, narrower RETURNING lists, and other JSON encoders. ``--profile`` prints the
top functions of a cProfile of the whole call.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import psycopg
from common import DEFAULT_URL, median, scratch
from psycopg.rows import dict_row, tuple_row

import jobsd
from jobsd.client import JobSpec
from jobsd.ids import uuid7
from jobsd.jsonsafe import encode_object
from jobsd.models import Job
from jobsd.settings import Settings
from jobsd.store.sqlfiles import load_queries

ORG, TYPE = "bench", "noop"


def per_call_sync(fn: Callable[[int], Any], n: int) -> float:
    for i in range(100):
        fn(-i)
    runs = []
    for _ in range(3):
        t = time.process_time()
        for i in range(n):
            fn(i)
        runs.append((time.process_time() - t) / n * 1e6)
    return median(runs)


async def per_call(fn: Callable[[int], Awaitable[Any]], n: int) -> float:
    for i in range(100):
        await fn(-i)
    runs = []
    for _ in range(3):
        t = time.process_time()
        for i in range(n):
            await fn(i)
        runs.append((time.process_time() - t) / n * 1e6)
    return median(runs)


def _params(spec: JobSpec) -> dict[str, Any]:
    return spec.insert_params()


async def main_async(url: str, n: int, profile: bool) -> None:
    rows: list[tuple[str, float]] = []
    q = load_queries()
    insert = q["jobs_insert"]
    async with jobsd.Client(url, settings=Settings(database_url=url, pool_size=4)) as client:

        async def enqueue(i: int) -> None:
            await client.enqueue(TYPE, {"i": i}, org_id=ORG)

        rows.append(("Client.enqueue, whole call", await per_call(enqueue, n)))
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            for i in range(n):
                await client.enqueue(TYPE, {"i": i}, org_id=ORG)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)

        pool = client._pool

        async def checkout(i: int) -> None:
            async with pool.connection():
                pass

        rows.append(("pool checkout and return, no statement", await per_call(checkout, n)))

    rows.append(
        (
            "JobSpec.build (checks, JSON, uuid7)",
            per_call_sync(lambda i: JobSpec.build(TYPE, {"i": i}, org_id=ORG), n),
        )
    )
    rows.append(("uuid7()", per_call_sync(lambda i: uuid7(), n)))
    rows.append(
        (
            "encode_object (json.dumps + NUL/surrogate/size checks)",
            per_call_sync(lambda i: encode_object({"i": i}, what="payload", max_bytes=None), n),
        )
    )
    rows.append(
        (
            "json.dumps alone",
            per_call_sync(
                lambda i: json.dumps(
                    {"i": i}, allow_nan=False, ensure_ascii=False, separators=(",", ":")
                ),
                n,
            ),
        )
    )
    try:
        import orjson

        rows.append(("orjson.dumps", per_call_sync(lambda i: orjson.dumps({"i": i}), n)))
    except ImportError:
        pass
    try:
        import msgspec

        enc = msgspec.json.Encoder()
        rows.append(
            ("msgspec.json.Encoder().encode", per_call_sync(lambda i: enc.encode({"i": i}), n))
        )
    except ImportError:
        pass

    spec = JobSpec.build(TYPE, {"i": 1}, org_id=ORG)
    narrow = insert.replace("RETURNING *", "RETURNING id, status, created_at")
    async with (
        jobsd.Client(url, settings=Settings(database_url=url, pool_size=4)) as client,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as conn,
    ):

        def fresh(i: int) -> dict[str, Any]:
            return {**_params(spec), "id": uuid7(), "payload": f'{{"i":{i}}}'}

        async def whole(i: int) -> None:
            await client.enqueue(TYPE, {"i": i}, org_id=ORG)

        async def stmt_dict(i: int) -> None:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(insert, fresh(i))
                Job.from_row((await cur.fetchall())[0])

        async def stmt_unprepared(i: int) -> None:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(insert, fresh(i), prepare=False)
                Job.from_row((await cur.fetchall())[0])

        async def stmt_narrow(i: int) -> None:
            async with conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(narrow, fresh(i))
                await cur.fetchall()

        async def select1(i: int) -> None:
            await conn.execute("SELECT 1")

        # interleaved rounds: the machine's load swings fall on every variant alike
        variants = {
            "Client.enqueue, whole call (interleaved)": whole,
            "jobs_insert alone: RETURNING *, dict rows, Job.from_row (auto-prepared)": stmt_dict,
            "jobs_insert alone, never prepared": stmt_unprepared,
            "jobs_insert alone: RETURNING id, status, created_at, tuple rows": stmt_narrow,
            "SELECT 1 round trip (floor)": select1,
        }
        samples: dict[str, list[float]] = {k: [] for k in variants}
        for fn in variants.values():
            for i in range(50):
                await fn(-i)
        for r in range(15):
            for name, fn in variants.items():
                t = time.process_time()
                for i in range(n // 15):
                    await fn(r * n + i)
                samples[name].append((time.process_time() - t) / (n // 15) * 1e6)
        for name, xs in samples.items():
            rows.append((name, median(xs)))

    print()
    print("| part of one enqueue | µs Python CPU per call |")
    print("|---|---|")
    for name, us in rows:
        print(f"| {name} | {us:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with scratch(args.database_url) as s:
        url = s.clone("client")
        anyio.run(main_async, url, args.n, args.profile)


if __name__ == "__main__":
    main()
