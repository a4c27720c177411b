"""How long a cancel of a running job takes to stop its handler: from the cancel's
commit until the job is written ``cancelled`` (the handler stopped, its process and
tools killed for a sync one), over N cancels per kind of handler.

    uv run python bench/cancel_latency.py [--cancels 50] [--database-url URL]

The heartbeat runs at its default interval (10 s): what is measured is the push (the
cancel's notification to the daemon that runs the job). Without ``--database-url`` a
throwaway embedded Postgres is used. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
import uuid

import anyio
from isolation_handlers import REGISTRY

import jobsd
from jobsd.dev.database import dev_database
from jobsd.settings import Settings
from jobsd.store.migrate import migrate_sync
from jobsd.worker.supervisor import Daemon

KINDS = ("sync_until_cancelled", "async_until_cancelled")


async def _status(client: jobsd.Client, job_id: uuid.UUID) -> tuple[str, dict[str, object]]:
    job = await client.get(job_id)
    return str(job.status), job.progress or {}


async def _cancels(url: str, kind: str, count: int) -> list[float]:
    settings = Settings(
        database_url=url, slots=4, progress_interval=0.05, worker_id=f"bench-{uuid.uuid4()}"
    )
    daemon = Daemon(settings, REGISTRY)
    took: list[float] = []
    async with jobsd.Client(url) as client, anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(daemon.run, handle_signals=False))
        await daemon.ready.wait()
        for _ in range(count):
            job = await client.enqueue(kind, {}, org_id="bench")
            # polled: the database is what says the handler runs, and when it stopped
            while not (await _status(client, job.id))[1].get("running"):  # noqa: ASYNC110
                await anyio.sleep(0.005)
            t0 = time.perf_counter()
            await client.cancel(job.id)
            while (await _status(client, job.id))[0] != "cancelled":  # noqa: ASYNC110
                await anyio.sleep(0.002)
            took.append(time.perf_counter() - t0)
        daemon.stop()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cancels", type=int, default=50)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    with dev_database(args.database_url) as (url, _):
        migrate_sync(url)
        rows = [(kind, anyio.run(_cancels, url, kind, args.cancels)) for kind in KINDS]
    print(f"| handler ({args.cancels} cancels) | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|")
    for kind, took in rows:
        ms = sorted(t * 1000 for t in took)
        p99 = statistics.quantiles(ms, n=100, method="inclusive")[98] if len(ms) > 1 else ms[0]
        print(f"| {kind} | {statistics.median(ms):.0f} | {p99:.0f} | {ms[-1]:.0f} |")


if __name__ == "__main__":
    main()
