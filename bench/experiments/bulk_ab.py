"""Scratch: a bulk enqueue (1,000 jobs per call) with the code of a git revision against
the working tree's, interleaved, client and backend CPU per job.

    JOBSD_ALLOW_INSECURE=1 JOBSD_REQUIRE_SCRAM=0 \
        uv run python bench/experiments/bulk_ab.py [--database-url URL] [--calls 20] \
        [--rev 2b10854]

The old side is jobsd/ids.py, jobsd/jsonsafe.py, jobsd/jobspec.py and
jobsd/store/enqueue.py as they were at ``--rev`` (read with ``git show``), loaded as
modules of their own; everything else (psycopg, the pool, the SQL) is shared. Each
call builds its 1,000 specs with its own side's ``JobSpec.build`` and inserts them
with its side's ``enqueue_many`` on the same pool.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from common import DEFAULT_URL, median, pids_cpu, scratch

import jobsd
from jobsd.jobspec import JobSpec
from jobsd.settings import Settings
from jobsd.store import enqueue as store_enqueue

B = 1000
ROOT = Path(__file__).resolve().parents[2]


def _old_module(rev: str, path: str, name: str, **overrides: Any) -> types.ModuleType:
    """Load ``path`` as it was at ``rev`` as module ``name``, names in ``overrides``
    replaced after its imports ran (so it calls the old code of its siblings)."""
    source = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses look their module up
    head, _, rest = source.partition("\n__all__")
    exec(compile(head, path, "exec"), module.__dict__)  # imports and docstring
    module.__dict__.update(overrides)
    exec(compile("__all__" + rest, path, "exec"), module.__dict__)
    return module


async def main_async(url: str, calls: int, rev: str) -> None:
    old_ids = _old_module(rev, "jobsd/ids.py", "old_ids")
    old_json = _old_module(rev, "jobsd/jsonsafe.py", "old_jsonsafe")
    old_spec = _old_module(
        rev,
        "jobsd/jobspec.py",
        "old_jobspec",
        uuid7=old_ids.uuid7,
        encode_object=old_json.encode_object,
    )
    old_enqueue = _old_module(rev, "jobsd/store/enqueue.py", "old_enqueue")
    async with jobsd.Client(url, settings=Settings(database_url=url, pool_size=2)) as client:
        await client._open()
        async with client._pool.connection() as c1, client._pool.connection() as c2:
            backends = (c1.info.backend_pid, c2.info.backend_pid)

        async def old(lo: int) -> None:
            specs = [
                old_spec.JobSpec.build("noop", {"i": i}, org_id="bench") for i in range(lo, lo + B)
            ]
            await old_enqueue.enqueue_many(client._pool, specs)

        async def new(lo: int) -> None:
            specs = [JobSpec.build("noop", {"i": i}, org_id="bench") for i in range(lo, lo + B)]
            await store_enqueue.enqueue_many(client._pool, specs)

        variants: dict[str, Callable[[int], Awaitable[None]]] = {
            f"enqueue_many at {rev}": old,
            "enqueue_many, working tree": new,
        }
        cpu: dict[str, list[float]] = defaultdict(list)
        pg: dict[str, list[float]] = defaultdict(list)
        lo = 0
        for fn in variants.values():
            for _ in range(3):
                await fn(lo)
                lo += B
        for _ in range(calls):
            for name, fn in variants.items():
                b0 = pids_cpu(*backends)
                t = time.process_time()
                await fn(lo)
                cpu[name].append((time.process_time() - t) / B * 1e6)
                pg[name].append((pids_cpu(*backends) - b0) / B * 1e6)
                lo += B
    print("| bulk enqueue, 1,000 per call | µs client CPU/job (median, min) | µs backend CPU/job |")
    print("|---|---|---|")
    for name in variants:
        print(
            f"| {name} | {median(cpu[name]):.1f}, {min(cpu[name]):.1f} | {median(pg[name]):.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rev", default="2b10854")
    args = parser.parse_args()
    with scratch(args.database_url) as s:
        anyio.run(main_async, s.clone("bulk_ab"), args.calls, args.rev)


if __name__ == "__main__":
    main()
