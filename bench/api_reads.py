"""The API's reads: ``GET /jobs/{id}`` (a job with its history) and ``GET /jobs`` (a page),
through the app in-process (httpx's ASGI transport), on a fresh database.

    JOBSD_ALLOW_INSECURE=1 uv run python bench/api_reads.py \\
        --database-url postgresql://postgres@127.0.0.1:5432/postgres --reads 3000

What a web API polling its jobs costs the API: one read per request, the token cached.
Reports requests per second and p50/p99 latency of each kind, sequential (one client).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

import anyio
import httpx
import psycopg
from psycopg import sql

from jobsd.http.app import create_app
from jobsd.http.settings import HttpSettings
from jobsd.settings import Settings
from jobsd.store.migrate import migrate_sync

JOBS = 200


def _token(url: str) -> str:
    """Store a token of org ``bench`` straight in the table (any schema version)."""
    import base64
    import hashlib
    import secrets

    made = "jobsd_" + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobsd.api_tokens (org_id, name, prefix, token_hash, admin) "
            "VALUES ('bench', 'bench', %s, %s, false)",
            (made[:12], hashlib.sha256(made.encode()).digest()),
        )
    return made


async def _timed(
    client: httpx.AsyncClient, paths: list[str], headers: dict[str, str]
) -> list[float]:
    took: list[float] = []
    for path in paths:
        start = time.perf_counter()
        answer = await client.get(path, headers=headers)
        took.append(time.perf_counter() - start)
        assert answer.status_code == 200, answer.text
    return took


def _figures(took: list[float]) -> dict[str, float]:
    ordered = sorted(took)
    return {
        "per_s": round(len(took) / sum(took), 1),
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 3),
    }


async def run(url: str, reads: int) -> dict[str, Any]:
    token = _token(url)
    headers = {"Authorization": f"Bearer {token}"}
    app = create_app(Settings(database_url=url), HttpSettings(read_rate=None, submit_rate=None))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            ids = []
            for i in range(JOBS):
                made = await client.post(
                    "/jobs", json={"type": "t", "payload": {"i": i}}, headers=headers
                )
                ids.append(made.json()["id"])
            gets = [f"/jobs/{ids[i % JOBS]}" for i in range(reads)]
            await _timed(client, gets[:200], headers)  # warm: plans, pool, token cache
            one = await _timed(client, gets, headers)
            pages = await _timed(client, ["/jobs?limit=50"] * (reads // 10), headers)
    return {"get_job": _figures(one), "list_page": _figures(pages)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--reads", type=int, default=3000)
    args = parser.parse_args()
    name = f"bench_reads_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(args.database_url, dbname=name)
    try:
        migrate_sync(url)
        print(json.dumps(anyio.run(run, url, args.reads)))
    finally:
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


if __name__ == "__main__":
    main()
