"""Scratch: the client's CPU floor of one insert, and of 1,000 in one statement, by driver.

    uv run --group bench python bench/experiments/driver_floor.py [--database-url URL]
        [--n 3000] [--rounds 5]

jobsd is on psycopg 3 (its C implementation, ``psycopg[binary]``); pgqueuer in the
side-by-side runs on asyncpg. Both drivers here send the same statements into the same
plain table (no trigger, no index but the primary key), autocommit, prepared: one row
per call, and 1,000 rows per call as arrays through ``unnest``. Process CPU per call
(per row for the bulk), median of ``--rounds`` interleaved rounds. What any library on
psycopg pays before doing anything of its own.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import psycopg
from common import run_on_scratch

_DDL = "CREATE TABLE floor_jobs (id uuid PRIMARY KEY, kind text NOT NULL, payload jsonb NOT NULL)"
_ONE = "INSERT INTO floor_jobs (id, kind, payload) VALUES ($1, $2, $3) RETURNING id"
_MANY = (
    "INSERT INTO floor_jobs (id, kind, payload)"
    " SELECT * FROM unnest($1::uuid[], $2::text[], $3::jsonb[]) RETURNING id"
)
_BULK = 1000


def _psycopg_sql(text: str) -> str:
    for i in (3, 2, 1):
        text = text.replace(f"${i}", "%s")
    return text


async def _cpu_per(n: int, call: Callable[[], Awaitable[object]]) -> float:
    c0 = time.process_time()
    for _ in range(n):
        await call()
    return (time.process_time() - c0) / n * 1e6


async def run(url: str, n: int, rounds: int) -> None:
    pg = await psycopg.AsyncConnection.connect(url, autocommit=True, prepare_threshold=0)
    apg = await asyncpg.connect(url)
    await pg.execute(_DDL)
    one_pg, many_pg = _psycopg_sql(_ONE), _psycopg_sql(_MANY)
    one_apg = await apg.prepare(_ONE)
    many_apg = await apg.prepare(_MANY)
    payload = json.dumps({"n": 1})

    async def psycopg_one() -> object:
        cur = await pg.execute(one_pg, (uuid.uuid4(), "t", payload))
        return await cur.fetchone()

    async def asyncpg_one() -> object:
        return await one_apg.fetchrow(uuid.uuid4(), "t", payload)

    def batch() -> tuple[list[uuid.UUID], list[str], list[str]]:
        return [uuid.uuid4() for _ in range(_BULK)], ["t"] * _BULK, [payload] * _BULK

    async def psycopg_many() -> object:
        cur = await pg.execute(many_pg, batch())
        return await cur.fetchall()

    async def asyncpg_many() -> object:
        return await many_apg.fetch(*batch())

    cases: dict[str, tuple[Callable[[], Awaitable[object]], int, int]] = {
        "one row per call, psycopg": (psycopg_one, n, 1),
        "one row per call, asyncpg": (asyncpg_one, n, 1),
        f"{_BULK} rows per call, psycopg": (psycopg_many, max(n // 100, 5), _BULK),
        f"{_BULK} rows per call, asyncpg": (asyncpg_many, max(n // 100, 5), _BULK),
    }
    for call, _, _ in cases.values():  # warm: plans, type caches
        await call()
    seen: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (call, calls, rows) in cases.items():
            seen[name].append(await _cpu_per(calls, call) / rows)
    await pg.close()
    await apg.close()
    print(f"client CPU (pid {os.getpid()}), median of {rounds} rounds:")
    for name, values in seen.items():
        unit = "µs/call" if "one row" in name else "µs/row"
        print(f"  {name}: {statistics.median(values):.1f} {unit}")


if __name__ == "__main__":
    run_on_scratch("driver_floor", run, n=3000, rounds=5)
