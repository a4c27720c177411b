"""Daemon cases: drain rate, and pickup latency on an idle daemon.

The daemon runs in the bench's process and event loop, built inside it, as an app that
embeds one would run it.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

import anyio
from measure import ORG, TYPE, Latency, Rate, Sizes, case_db, client_for, enqueue_bulk, onoff
from probe import Probe
from server import BenchServer

import jobsd
from jobsd.registry import Registry
from jobsd.settings import Settings
from jobsd.worker.supervisor import Daemon

__all__ = ["bench_registry", "case_drain", "case_latency", "running_daemon", "settled"]


@asynccontextmanager
async def running_daemon(settings: Settings, registry: Registry) -> AsyncIterator[Daemon]:
    """Run a daemon in this event loop until the block ends; then stop it gracefully."""
    daemon = Daemon(settings, registry)
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(daemon.run, handle_signals=False))
        with anyio.fail_after(30):
            await daemon.ready.wait()
        try:
            yield daemon
        finally:
            daemon.stop()


def bench_registry(
    on_start: Callable[[jobsd.JobContext], None] | None = None,
    sleep_ms: tuple[float, float] | None = None,
) -> Registry:
    """Register the bench's handler: record its start, then sleep a random while if asked."""
    registry = Registry()
    rng = random.Random(3)

    @jobsd.handler(TYPE, registry=registry)
    async def noop(ctx: jobsd.JobContext) -> None:
        if on_start is not None:
            on_start(ctx)
        if sleep_ms is not None:
            await anyio.sleep(rng.uniform(*sleep_ms) / 1000)

    return registry


def settled(daemon: Daemon) -> int:
    """Return how many outcomes the daemon has written or discarded."""
    return sum(daemon.stats.finished.values()) + daemon.stats.discarded


async def case_drain(
    server: BenchServer,
    sizes: Sizes,
    slots: int,
    sleep_ms: tuple[float, float] | None = None,
) -> Rate:
    """Pre-enqueue jobs, then time one daemon from start until every outcome is written."""
    n = sizes.drain
    if sleep_ms is None:
        what = "no-op handler"
    else:
        what = f"handler sleeps {sleep_ms[0]:g}-{sleep_ms[1]:g} ms"
    rate = Rate(f"drain, {slots} slots, {what}", "on", n)
    async with case_db(server, "drain") as (url, meter):
        async with client_for(url) as client:
            await enqueue_bulk(client, n, sizes.bulk_batch)
        settings = Settings(database_url=url, slots=slots, handlers=[])
        # The completer settles a batch right after its statement returns, so a waiter
        # woken by the probe sees the counts of that batch.
        wrote = anyio.Event()
        probe = Probe(on_call=lambda: wrote.set())
        registry = bench_registry(sleep_ms=sleep_ms)
        with probe.installed():
            await meter.start()
            t0 = time.perf_counter()
            async with running_daemon(settings, registry) as daemon:
                ready_s = time.perf_counter() - t0
                while settled(daemon) < n:
                    await wrote.wait()
                    wrote = anyio.Event()
                rate = await meter.stop(rate)
        cur = await meter.conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'),"
            " (SELECT count(*) FROM jobsd.job_events),"
            " count(*) FILTER (WHERE status = 'running') FROM jobsd.jobs"
        )
        row = await cur.fetchone()
        assert row is not None
    notes = []
    if daemon.stats.discarded:
        notes.append(f"{daemon.stats.discarded} outcomes reported discarded")
    if row[0] != n:
        notes.append(f"{row[0]} of {n} succeeded in the database")
    if row[2]:
        notes.append(f"{row[2]} jobs left 'running' after the daemon stopped")
    rate.note = "; ".join(notes)
    rate.anatomy = {
        "probe": probe,
        "ready_s": ready_s,
        "wakeups": dict(daemon.stats.wakeups),
        "events": row[1],
    }
    return rate


async def case_latency(
    server: BenchServer, sizes: Sizes, *, notify: bool, poll_s: float
) -> Latency:
    """Enqueue jobs one at a time, with a random gap, on an idle daemon; time each pickup.

    With ``notify`` off the trigger is disabled and the daemon does not LISTEN: poll-only.
    """
    n = sizes.latency
    result = Latency("pickup latency, idle daemon", onoff(notify), poll_s)
    starts: dict[int, float] = {}
    commits: dict[int, float] = {}
    rng = random.Random(2)
    lo, hi = sizes.latency_gap_ms
    all_started = anyio.Event()

    def on_start(ctx: jobsd.JobContext) -> None:
        starts.setdefault(ctx.payload["seq"], time.perf_counter())
        if all(s in starts for s in range(n)):
            all_started.set()

    registry = bench_registry(on_start)
    async with case_db(server, "latency", notify=notify) as (url, meter):
        settings = Settings(
            database_url=url, slots=10, poll_interval=poll_s, notify=notify, handlers=[]
        )
        async with client_for(url) as client, running_daemon(settings, registry):
            await client.enqueue(TYPE, {"seq": -1}, org_id=ORG)  # opens the pool
            await anyio.sleep(0.3)  # let the start-up claim round pass
            for seq in range(n):
                await client.enqueue(TYPE, {"seq": seq}, org_id=ORG)
                commits[seq] = time.perf_counter()
                await anyio.sleep(rng.uniform(lo, hi) / 1000)
            with anyio.move_on_after(poll_s * 4 / 3 + 5):
                await all_started.wait()
        cur = await meter.conn.execute("SELECT count(*) FROM jobsd.jobs WHERE status = 'running'")
        row = await cur.fetchone()
        assert row is not None
        left_running = row[0]
    result.samples = [starts[s] - commits[s] for s in range(n) if s in starts]
    notes = []
    if len(result.samples) < n:
        notes.append(f"{n - len(result.samples)} of {n} never started")
    if left_running:
        notes.append(f"{left_running} jobs left 'running' after the daemon stopped")
    result.note = "; ".join(notes)
    return result
