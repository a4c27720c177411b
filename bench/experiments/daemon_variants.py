"""Scratch: the daemon's Python CPU per drained job with candidate changes patched in.

    uv run python bench/experiments/daemon_variants.py [--database-url URL]
        [--jobs 10000] [--slots 10 100] [--rounds 3]

In-process drains (bench/daemon_cases.py), no profiler, process CPU per job; variants
interleaved round by round. The patches are scratch monkeypatches of this process's
jobsd, not proposals of code:

- held index: ``Holdings.add`` finds an earlier run of the same job through a dict by
  job id instead of scanning every held run (100 slots: ~150 UUID compares per claim);
- + lazy logs: the completer builds its per-job ``job.finished`` log record only when
  INFO is enabled;
- + narrow finish: ``jobs_finish_batch`` returns (id, type, status, concurrency_key)
  and is decoded into tuples, instead of ``RETURNING j.*`` into ``Job`` objects.
"""

from __future__ import annotations

import argparse
import logging
import time
import uuid
from collections import defaultdict
from typing import Any

import anyio
from common import DEFAULT_URL, median, scratch
from daemon_cases import bench_registry, running_daemon, settled
from measure import client_for, enqueue_bulk
from psycopg.rows import tuple_row

import jobsd.worker.completer as completer_mod
from jobsd.settings import Settings
from jobsd.store import queries
from jobsd.worker.holdings import Held, Holdings

_ORIG = {
    "init": Holdings.__init__,
    "add": Holdings.add,
    "forget": Holdings.forget,
    "settle": completer_mod.Completer._settle,
    "finish": queries.finish_batch,
}


def _indexed_init(self: Holdings, slots: int) -> None:
    _ORIG["init"](self, slots)
    self._by_job = defaultdict(set)  # type: ignore[attr-defined]


def _indexed_add(self: Holdings, job: Any, ctx: Any) -> Held:
    for lease in list(self._by_job.get(job.id, ())):  # type: ignore[attr-defined]
        earlier = self._held.get(lease)
        if earlier is not None:
            earlier.superseded = True
            self.mark_lost(earlier)
    held = Held(job=job, lease_id=job.lease_id, ctx=ctx)
    self._held[held.lease_id] = held
    self._by_job[job.id].add(held.lease_id)  # type: ignore[attr-defined]
    self._running += 1
    return held


def _indexed_forget(self: Holdings, held: Held) -> None:
    leases = self._by_job.get(held.job.id)  # type: ignore[attr-defined]
    if leases is not None:
        leases.discard(held.lease_id)
        if not leases:
            del self._by_job[held.job.id]  # type: ignore[attr-defined]
    _ORIG["forget"](self, held)


class _Light:
    __slots__ = ("concurrency_key", "id", "status", "type")

    def __init__(self, row: tuple[Any, ...]) -> None:
        self.id, self.type, self.status, self.concurrency_key = row


def _lazy_settle(self: Any, batch: list[Any], written: dict[uuid.UUID, Any]) -> list[uuid.UUID]:
    info = completer_mod.log.isEnabledFor(logging.INFO)
    discarded: list[uuid.UUID] = []
    for result in batch:
        job_id = result.held.job.id
        job = None if result.held.superseded else written.get(job_id)
        self.holdings.forget(result.held)
        if job is None:
            self.stats.discarded += 1
            discarded.append(job_id)
            continue
        self.stats.finished[(job.type, str(job.status))] += 1
        if info:
            completer_mod.log.info("job.finished", extra={"job_id": str(job_id)})
        if job.status == "failed":
            self.on_failed(job)
        elif job.status == "scheduled" and self.on_scheduled is not None:
            self.on_scheduled()
        if job.concurrency_key is not None and self.on_key_freed is not None:
            self.on_key_freed()
    return discarded


async def _narrow_finish(conn: Any, rows: Any) -> dict[uuid.UUID, Any]:
    """finish_batch with RETURNING id, type, status, concurrency_key (scratch SQL)."""
    import json

    from jobsd.store.queries import sql_text

    if not rows:
        return {}
    text = sql_text("jobs_finish_batch").replace(
        "RETURNING j.*", "RETURNING j.id, j.type, j.status, j.concurrency_key"
    )
    results = json.dumps(
        [
            {
                "id": str(r.job_id),
                "lease_id": str(r.lease_id),
                "status": r.status,
                "error": r.error,
                "reason": r.reason,
                "progress": r.progress,
                "run_after": None,
                "delay_s": r.delay_s,
                "report": None,
            }
            for r in rows
        ]
    )
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(text, {"results": results})
        return {row[0]: _Light(row) for row in await cur.fetchall()}


def apply(variant: str) -> None:
    Holdings.__init__ = _ORIG["init"]  # type: ignore[method-assign]
    Holdings.add = _ORIG["add"]  # type: ignore[method-assign]
    Holdings.forget = _ORIG["forget"]  # type: ignore[method-assign]
    completer_mod.Completer._settle = _ORIG["settle"]  # type: ignore[method-assign]
    queries.finish_batch = _ORIG["finish"]
    if variant == "base":
        return
    Holdings.__init__ = _indexed_init  # type: ignore[method-assign, assignment]
    Holdings.add = _indexed_add  # type: ignore[method-assign]
    Holdings.forget = _indexed_forget  # type: ignore[method-assign]
    if variant == "held index":
        return
    completer_mod.Completer._settle = _lazy_settle  # type: ignore[method-assign]
    if variant == "+ lazy logs":
        return
    queries.finish_batch = _narrow_finish  # type: ignore[assignment]


VARIANTS = ("base", "held index", "+ lazy logs", "+ narrow finish")


async def drain(url: str, jobs: int, slots: int) -> tuple[float, float]:
    async with client_for(url) as client:
        await enqueue_bulk(client, jobs, 1000)
    settings = Settings(database_url=url, slots=slots, handlers=[])
    t0, c0 = time.perf_counter(), time.process_time()
    async with running_daemon(settings, bench_registry()) as daemon:
        while settled(daemon) < jobs:  # noqa: ASYNC110 - a scratch poll, 5 ms
            await anyio.sleep(0.005)
    return jobs / (time.perf_counter() - t0), (time.process_time() - c0) / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--slots", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    out: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    with scratch(args.database_url) as s:
        for r in range(args.rounds):
            for slots in args.slots:
                for v in VARIANTS:
                    apply(v)
                    url = s.clone(f"dv{r}")
                    out[(slots, v)].append(anyio.run(drain, url, args.jobs, slots))
                    s.drop(url)
                    print(r, slots, v, out[(slots, v)][-1], flush=True)
    apply("base")
    print("\n| slots | variant | jobs/s | µs Python CPU/job |")
    print("|---|---|---|---|")
    for (slots, v), xs in out.items():
        print(
            f"| {slots} | {v} | {median([x[0] for x in xs]):,.0f} | "
            f"{median([x[1] for x in xs]):.0f} |"
        )


if __name__ == "__main__":
    main()
