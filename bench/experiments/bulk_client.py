"""Scratch: where a bulk enqueue (1,000 jobs per call) spends, client and server.

    uv run python bench/experiments/bulk_client.py [--database-url URL] [--calls 20]

Interleaved rounds; per job: the bench process's CPU and the backend's (schedstat).
Variants: ``Client.enqueue_many``; its parts (``JobSpec.build`` x1000, the column
arrays); ``jobs_insert_many`` alone with ``RETURNING *`` into ``Job`` objects, with
``RETURNING id`` into tuples, and ``COPY ... FROM STDIN`` (binary) of the same rows
(statement triggers fire once per COPY too).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

import anyio
import psycopg
from common import DEFAULT_URL, median, pids_cpu, scratch
from psycopg.rows import dict_row, tuple_row

import jobsd
from jobsd.client import JobSpec
from jobsd.models import Job
from jobsd.settings import Settings
from jobsd.store.enqueue import _many_params
from jobsd.store.sqlfiles import load_queries

B = 1000


def specs(lo: int) -> list[JobSpec]:
    return [JobSpec.build("noop", {"i": i}, org_id="bench") for i in range(lo, lo + B)]


async def main_async(url: str, calls: int) -> None:
    q = load_queries()
    many = q["jobs_insert_many"]
    star = many.replace("RETURNING id, status, run_after, created_at", "RETURNING *")
    narrow = many.replace("RETURNING id, status, run_after, created_at", "RETURNING id")
    async with (
        jobsd.Client(url, settings=Settings(database_url=url, pool_size=2)) as client,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as conn,
    ):
        async with client._pool.connection() as pc:
            client_backend = pc.info.backend_pid

        async def whole(lo: int) -> None:
            await client.enqueue_many(specs(lo))

        async def build_only(lo: int) -> None:
            _many_params(specs(lo))

        async def stmt_star(lo: int) -> None:
            params = _many_params(specs(lo))
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(star, params)
                [Job.from_row(r) for r in await cur.fetchall()]

        async def stmt_id(lo: int) -> None:
            params = _many_params(specs(lo))
            async with conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(narrow, params)
                await cur.fetchall()

        async def copy(lo: int) -> None:
            ss = specs(lo)
            async with (
                conn.cursor() as cur,
                cur.copy(
                    "COPY jobsd.jobs (id, org_id, type, queue, status, payload, priority)"
                    " FROM STDIN (FORMAT BINARY)"
                ) as cp,
            ):
                cp.set_types(["uuid", "text", "text", "text", "text", "jsonb", "int4"])
                for s in ss:
                    await cp.write_row(
                        (s.id, s.org_id, s.type, s.queue, "queued", s.payload_json, 0)
                    )

        variants: dict[str, Callable[[int], Awaitable[None]]] = {
            "Client.enqueue_many (RETURNING *, Job objects)": whole,
            "JobSpec.build x1000 + column arrays, no statement": build_only,
            "jobs_insert_many alone, RETURNING *, Job.from_row": stmt_star,
            "jobs_insert_many alone, RETURNING id, tuples": stmt_id,
            "COPY FROM STDIN (binary), no RETURNING": copy,
        }
        cpu: dict[str, list[float]] = defaultdict(list)
        pg: dict[str, list[float]] = defaultdict(list)
        lo = 0
        for fn in variants.values():
            await fn(lo)
            lo += B
        for _ in range(calls):
            for name, fn in variants.items():
                pid_conn = client_backend if fn is whole else conn.info.backend_pid
                b0 = pids_cpu(pid_conn)
                t = time.process_time()
                await fn(lo)
                cpu[name].append((time.process_time() - t) / B * 1e6)
                pg[name].append((pids_cpu(pid_conn) - b0) / B * 1e6)
                lo += B
    print("| bulk enqueue, 1,000 per call | µs client CPU/job | µs backend CPU/job |")
    print("|---|---|---|")
    for name in variants:
        print(f"| {name} | {median(cpu[name]):.1f} | {median(pg[name]):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    with scratch(args.database_url) as s:
        anyio.run(main_async, s.clone("bulk"), args.calls)


if __name__ == "__main__":
    main()
