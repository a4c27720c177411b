"""Scratch: where an idle daemon's pickup goes (notification, claim, start).

    uv run --group bench python bench/experiments/pickup_parts.py URL [--jobs 200]

One daemon in this process; jobs enqueued one at a time 10-40 ms apart. For each job:
enqueue commit -> notification relayed -> claim statement sent -> claim returned ->
handler started (perf_counter stamps; the claim's by wrapping queries.claim_batch).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import anyio
import common  # noqa: F401  (puts bench/ on the path)
from daemon_cases import bench_registry, running_daemon
from measure import ORG, TYPE, client_for

import jobsd
from jobsd.settings import Settings
from jobsd.store import queries
from jobsd.worker import listener as listener_mod


async def main_async(url: str, n: int) -> None:
    notified: list[float] = []
    claims: list[tuple[float, float, int]] = []
    starts: dict[int, float] = {}
    real_claim = queries.claim_batch

    async def timed_claim(*args: object, **kwargs: object) -> object:
        t0 = time.perf_counter()
        jobs = await real_claim(*args, **kwargs)  # type: ignore[arg-type]
        claims.append((t0, time.perf_counter(), len(jobs)))  # type: ignore[arg-type]
        return jobs

    real_wake = listener_mod.Waker.wake

    def wake(self: object, cause: str) -> None:
        if cause == "notify":
            notified.append(time.perf_counter())
        real_wake(self, cause)  # type: ignore[arg-type]

    handed: dict[int, float] = {}
    from jobsd.worker.executor import JobRunner

    real_start = JobRunner.start

    def start(self: JobRunner, job: jobsd.Job) -> None:
        handed.setdefault(job.payload.get("seq", -9), time.perf_counter())
        real_start(self, job)

    JobRunner.start = start  # type: ignore[method-assign]
    promotes: list[tuple[float, float]] = []
    real_promote = queries.promote_due

    async def timed_promote(*args: object, **kwargs: object) -> object:
        t0 = time.perf_counter()
        out = await real_promote(*args, **kwargs)  # type: ignore[arg-type]
        promotes.append((t0, time.perf_counter()))
        return out

    queries.promote_due = timed_promote  # type: ignore[assignment]
    queries.claim_batch = timed_claim  # type: ignore[assignment]
    listener_mod.Waker.wake = wake  # type: ignore[method-assign]

    def on_start(ctx: jobsd.JobContext) -> None:
        starts.setdefault(ctx.payload["seq"], time.perf_counter())

    rng = random.Random(2)
    settings = Settings(database_url=url, slots=10, poll_interval=30, handlers=[])
    commits: list[float] = []
    async with client_for(url) as client, running_daemon(settings, bench_registry(on_start)):
        await client.enqueue(TYPE, {"seq": -1}, org_id=ORG)
        await anyio.sleep(0.3)
        notified.clear()
        claims.clear()
        for seq in range(n):
            await client.enqueue(TYPE, {"seq": seq}, org_id=ORG)
            commits.append(time.perf_counter())
            await anyio.sleep(rng.uniform(10, 40) / 1000)
        await anyio.sleep(0.2)
    names = ("notify", "to claim", "claim", "start", "total", "handed->run")
    parts: dict[str, list[float]] = {name: [] for name in names}
    for seq, commit in enumerate(commits):
        start = starts.get(seq)
        if start is None:
            continue
        note = next((t for t in notified if t >= commit - 0.005), None)
        claim = next((c for c in claims if c[2] and c[1] <= start and c[1] >= commit - 0.005), None)
        if note is None or claim is None:
            continue
        parts["notify"].append(note - commit)
        parts["to claim"].append(claim[0] - note)
        parts["claim"].append(claim[1] - claim[0])
        parts["start"].append(start - claim[1])
        parts["total"].append(start - commit)
        parts["handed->run"].append(start - handed[seq])
    after = [p for p in promotes if p[0] >= commits[0]]
    print("promotes during the run:", len(after))
    late = 0
    for seq in range(n):
        st = starts.get(seq)
        h = handed.get(seq)
        if st is None or h is None:
            continue
        p = next((p for p in promotes if p[0] >= h), None)
        if p is not None and st >= p[1]:
            late += 1
    print("handlers that started only after the promotion's answer:", late)
    for name, xs in parts.items():
        xs.sort()
        p99 = xs[max(0, round(0.99 * len(xs)) - 1)]
        p50, top = statistics.median(xs), xs[-1]
        print(
            f"{name:11s} p50 {p50 * 1e3:6.2f} ms  p99 {p99 * 1e3:6.2f}  max {top * 1e3:6.2f}"
            f"  (n={len(xs)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    anyio.run(main_async, args.url, args.jobs)


if __name__ == "__main__":
    main()
