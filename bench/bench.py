"""Measure jobsd: enqueue rates with NOTIFY on and off, drain rate, and pickup latency.

    uv run python bench/bench.py [--database-url URL] [--jobs 20000] [--slots 10] [--quick]

Prints markdown tables on stdout; progress goes to stderr. Each case runs once (or
``--repeat`` times, reporting the median) in a fresh database cloned from a migrated
template. Without ``--database-url`` a throwaway cluster is started (fsync on, unless
``--no-fsync``) and removed at the end; a given URL must be allowed to CREATE DATABASE.
bench/README.md says what each figure means.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any

import anyio
import psycopg
from daemon_cases import case_drain, case_latency
from enqueue_cases import case_bulk, case_concurrent, case_floor, case_server_side, case_single
from libs import LIBRARIES, PEER_ADAPTERS
from measure import Latency, Rate, Sizes, nearest_rank, onoff, table
from probe import Probe
from server import BenchServer, ServerInfo
from side_by_side import side_bulk, side_drain, side_latency, side_report, side_single

QUICK = Sizes(
    floor=200,
    single=300,
    bulk=5_000,
    concurrent=800,
    server_side_s=1,
    drain=1_000,
    latency=20,
    warmup=20,
)
CASES = ("floor", "single", "bulk", "concurrent", "server", "drain", "latency")
SIDE_CASES = ("single", "bulk", "drain", "latency")
CASE_TIMEOUT_S = 90.0
SIDE_CASE_TIMEOUT_S = 300.0


# -- running ---------------------------------------------------------------------------


class Runner:
    """Run cases in order; a case that fails or times out becomes a row with a note."""

    def __init__(self, repeat: int, timeout_s: float = CASE_TIMEOUT_S) -> None:
        self.repeat = repeat
        self.timeout_s = timeout_s
        self.rates: list[Rate] = []
        self.latencies: list[Latency] = []

    async def _once(self, label: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        log(f"running {label} ...")
        t = time.perf_counter()
        try:
            with anyio.fail_after(self.timeout_s):
                result = await fn()
        except Exception as exc:  # a broken case is a row, not a lost report
            log(f"  {label} failed: {exc!r}")
            return exc
        log(f"  done in {time.perf_counter() - t:.1f} s")
        return result

    async def rate(self, label: str, fn: Callable[[], Awaitable[Rate]], fallback: Rate) -> None:
        """Run a throughput case ``repeat`` times and keep the median run."""
        runs: list[Rate] = []
        for _ in range(self.repeat):
            result = await self._once(label, fn)
            if isinstance(result, Exception):
                fallback.note = _error_note(result)
                self.rates.append(fallback)
                return
            runs.append(result)
        self.rates.append(_median(runs))

    async def floor(self, fn: Callable[[], Awaitable[list[Rate]]], fallback: Rate) -> None:
        """Run the floor case (two figures) ``repeat`` times and keep each median."""
        runs: list[list[Rate]] = []
        for _ in range(self.repeat):
            result = await self._once("floor", fn)
            if isinstance(result, Exception):
                fallback.note = _error_note(result)
                self.rates.append(fallback)
                return
            runs.append(result)
        self.rates.extend(_median(list(figure)) for figure in zip(*runs, strict=True))

    async def interleaved(
        self, cases: list[tuple[str, Callable[[], Awaitable[Rate | Latency]], Rate | Latency]]
    ) -> None:
        """Run each case ``repeat`` times, round-robin (one run of each, then again), so
        that the machine's swings fall on every case alike; keep each case's median rate,
        or all its latency samples together."""
        runs: list[list[Rate | Latency]] = [[] for _ in cases]
        failed: dict[int, BaseException] = {}
        for _ in range(self.repeat):
            for k, (label, fn, _fallback) in enumerate(cases):
                if k in failed:
                    continue
                result = await self._once(label, fn)
                if isinstance(result, BaseException):
                    failed[k] = result
                else:
                    runs[k].append(result)
        for k, (_label, _fn, fallback) in enumerate(cases):
            if k in failed:
                fallback.note = _error_note(failed[k])
                kept: Rate | Latency = fallback
            elif isinstance(fallback, Latency):
                kept = replace(runs[k][0])
                kept.samples = [x for lat in runs[k] for x in lat.samples]  # type: ignore[union-attr]
                kept.note = "; ".join(sorted({r.note for r in runs[k] if r.note}))
            else:
                kept = _median(runs[k])  # type: ignore[arg-type]
            if isinstance(kept, Latency):
                self.latencies.append(kept)
            else:
                self.rates.append(kept)

    async def latency(self, fn: Callable[[], Awaitable[Latency]], fallback: Latency) -> None:
        result = await self._once(f"latency notify={fallback.notify}", fn)
        if isinstance(result, Exception):
            fallback.note = _error_note(result)
            result = fallback
        self.latencies.append(result)


def _error_note(exc: BaseException) -> str:
    return f"error: {type(exc).__name__}: {exc}"[:160].replace("|", "/").replace("\n", " ")


def _median(runs: list[Rate]) -> Rate:
    if len(runs) == 1:
        return runs[0]
    ordered = sorted(runs, key=lambda r: r.per_s)
    mid = replace(ordered[(len(ordered) - 1) // 2])
    spread = f"median of {len(runs)}: {ordered[0].per_s:,.0f}-{ordered[-1].per_s:,.0f}/s"
    mid.note = f"{spread}; {mid.note}" if mid.note else spread
    return mid


async def run_peers(args: argparse.Namespace, server: BenchServer, info: ServerInfo) -> str:
    """Run the side-by-side cases on jobsd and the peers; return the report."""
    t0 = time.perf_counter()
    sizes = _sizes(args)
    wanted = set(args.only or SIDE_CASES)
    libs = ["jobsd", *args.peers]
    run = Runner(args.repeat, timeout_s=SIDE_CASE_TIMEOUT_S)
    cases: list[tuple[str, Callable[[], Awaitable[Rate | Latency]], Rate | Latency]] = []
    if "single" in wanted:
        for lib in libs:
            fallback = Rate("enqueue, one job per call", "on", sizes.single, lib=lib)
            cases.append((f"{lib} single", partial(side_single, server, sizes, lib), fallback))
    if "bulk" in wanted:
        for lib in libs:
            case = f"enqueue, {sizes.bulk_batch:,} jobs per call"
            fallback = Rate(case, "on", sizes.bulk, lib=lib)
            cases.append((f"{lib} bulk", partial(side_bulk, server, sizes, lib), fallback))
    if "drain" in wanted:
        for setting in ("default", "best"):
            for lib in libs:
                fallback = Rate(f"drain, {setting} settings", "on", sizes.drain, lib=lib)
                fn = partial(side_drain, server, sizes, lib, setting)
                cases.append((f"{lib} drain {setting}", fn, fallback))
    if "latency" in wanted:
        for lib in libs:
            fallback = Latency("pickup latency, idle worker", "on", 0.0, lib=lib)
            cases.append((f"{lib} latency", partial(side_latency, server, sizes, lib), fallback))
    await run.interleaved(cases)
    took = time.perf_counter() - t0
    return "\n".join(
        [
            *_header(args, info, took, "jobsd and its peers side by side"),
            "",
            side_report(libs, run.rates, run.latencies),
        ]
    )


def _sizes(args: argparse.Namespace) -> Sizes:
    sizes = QUICK if args.quick else Sizes()
    if args.jobs:
        sizes = replace(sizes, drain=args.jobs)
    return sizes


async def run_all(args: argparse.Namespace, server: BenchServer, info: ServerInfo) -> str:
    """Run the chosen cases and return the report."""
    if args.peers:
        return await run_peers(args, server, info)
    t0 = time.perf_counter()
    sizes = _sizes(args)
    wanted = set(args.only or CASES)
    run = Runner(args.repeat)

    if "floor" in wanted:
        await run.floor(partial(case_floor, server, sizes), Rate("floor", "-", sizes.floor))
    enqueue_cases = (
        ("single", case_single, sizes.single),
        ("bulk", case_bulk, sizes.bulk),
        ("concurrent", case_concurrent, sizes.concurrent),
        ("server", case_server_side, 0),
    )
    for name, fn, n in enqueue_cases:
        if name in wanted:
            for notify in (True, False):
                await run.rate(
                    f"{name} notify={onoff(notify)}",
                    partial(fn, server, sizes, notify),
                    Rate(f"enqueue, {name}", onoff(notify), n),
                )
    if "drain" in wanted:
        for sleep_ms in (None, sizes.drain_sleep_ms):
            await run.rate(
                f"drain sleep={sleep_ms}",
                partial(case_drain, server, sizes, args.slots, sleep_ms),
                Rate(f"drain, {args.slots} slots", "on", sizes.drain),
            )
    if "latency" in wanted:
        for notify, poll_s in ((True, 30.0), (False, 1.5)):
            await run.latency(
                partial(case_latency, server, sizes, notify=notify, poll_s=poll_s),
                Latency("pickup latency, idle daemon", onoff(notify), poll_s),
            )
    return report(args, info, run, time.perf_counter() - t0)


# -- report ----------------------------------------------------------------------------


def _rate_row(r: Rate) -> list[str]:
    if math.isnan(r.seconds) or r.n == 0:
        return [r.case, r.notify, f"{r.n:,}", "-", "-", "-", "-", "-", "-", r.note]

    def per_job_us(x: float | None) -> str:
        return "n/a" if x is None else f"{x / r.n * 1e6:,.0f}"

    return [
        r.case,
        r.notify,
        f"{r.n:,}",
        f"{r.seconds:.2f}",
        f"**{r.per_s:,.0f}**",
        per_job_us(r.client_cpu_s),
        per_job_us(r.pg_cpu_s),
        "n/a" if r.other_cpu_share is None else f"{r.other_cpu_share:.0%}",
        "n/a" if r.wal_bytes is None else f"{r.wal_bytes / r.n:,.0f}",
        r.note,
    ]


def _latency_row(lat: Latency) -> list[str]:
    xs = sorted(lat.samples)
    head = [lat.case, lat.notify, f"{lat.poll_s:g} s", f"{len(xs)}"]
    if not xs:
        return [*head, "-", "-", "-", lat.note]
    ms = [f"{nearest_rank(xs, q) * 1000:,.1f}" for q in (0.5, 0.99)]
    return [*head, *ms, f"{xs[-1] * 1000:,.1f}", lat.note]


def drain_anatomy(rate: Rate) -> str:
    """Say where a drained job's time went: statements per job and their round trips."""
    assert rate.anatomy is not None
    probe: Probe = rate.anatomy["probe"]
    n, wall = rate.n, rate.seconds
    rows = []
    for name, s in sorted(probe.stats.items()):
        if not s.calls:
            continue
        rows.append(
            [
                f"`{name}`",
                f"{s.calls:,}",
                f"{s.rows / s.calls:,.1f}",
                f"{s.calls / n:.3f}",
                f"{s.seconds / s.calls * 1000:.2f}",
                f"{s.seconds / wall:.0%}",
            ]
        )
    wakeups = ", ".join(f"{k} {v:,}" for k, v in sorted(rate.anatomy["wakeups"].items()))
    cpu = f"{rate.client_cpu_s / n * 1e6:,.0f} µs Python CPU" if rate.client_cpu_s else ""
    if rate.pg_cpu_s:
        cpu += f", {rate.pg_cpu_s / n * 1e6:,.0f} µs Postgres CPU"
    head = ["statement", "calls", "rows/call", "calls/job", "ms/call", "busy share of wall"]
    return "\n".join(
        [
            f"**{rate.case}** ({n:,} jobs, {rate.per_s:,.0f} jobs/s)",
            "",
            table(head, rows),
            "",
            f"Per job: {wall / n * 1e6:,.0f} µs wall, {cpu}. "
            f"Daemon ready {rate.anatomy['ready_s'] * 1000:.0f} ms after start; claimer "
            f"wake-ups: {wakeups}; {rate.anatomy['events'] / n:.2f} job_events rows per job.",
        ]
    )


def _header(args: argparse.Namespace, info: ServerInfo, took_s: float, what: str) -> list[str]:
    return [
        f"# {what}{' (--quick: small N, a smoke run)' if args.quick else ''}",
        "",
        f"- Postgres {info.version}, {info.where}; fsync={info.fsync}, "
        f"synchronous_commit={info.synchronous_commit}",
        f"- machine: {os.cpu_count()} cores ({platform.machine()}), Python "
        f"{platform.python_version()}, psycopg {psycopg.__version__}; the bench, the workers "
        "and Postgres share these cores",
        f"- {_versions(['jobsd', *getattr(args, 'peers', [])])}; each case in a fresh database, "
        + ("once" if args.repeat == 1 else f"{args.repeat} times (median shown)")
        + f"; whole run {took_s:.0f} s",
    ]


def report(args: argparse.Namespace, info: ServerInfo, run: Runner, took_s: float) -> str:
    """Return the markdown report."""
    out = [*_header(args, info, took_s, "jobsd bench"), ""]
    if run.rates:
        head = [
            "case",
            "NOTIFY",
            "N",
            "s",
            "jobs/s",
            "µs client CPU/job",
            "µs Postgres CPU/job",
            "other load",
            "WAL B/job",
            "note",
        ]
        out += [table(head, [_rate_row(r) for r in run.rates]), ""]
    if run.latencies:
        head = ["case", "NOTIFY", "poll", "N", "p50 ms", "p99 ms", "max ms", "note"]
        out += [table(head, [_latency_row(lat) for lat in run.latencies]), ""]
    drains = [r for r in run.rates if r.anatomy is not None]
    if drains:
        out += ["## Drain: where the time goes", ""]
        for rate in drains:
            out += [drain_anatomy(rate), ""]
    return "\n".join(out)


def _versions(names: list[str]) -> str:
    def one(name: str) -> str:
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            return f"{name} ?"

    # an adapter named <library>_<driver> runs that library's release
    return ", ".join(one(n) for n in dict.fromkeys(n.split("_")[0] for n in names))


def _peer_list(text: str) -> list[str]:
    """The adapters the named peers stand for: pgqueuer is run on asyncpg and on psycopg."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = [lib for lib in LIBRARIES if lib != "jobsd"]
    adapters: list[str] = []
    for name in names:
        if name in PEER_ADAPTERS:
            adapters.extend(PEER_ADAPTERS[name])
        elif name in known:
            adapters.append(name)
        else:
            raise argparse.ArgumentTypeError(f"unknown peer {name!r}; known: {', '.join(known)}")
    return list(dict.fromkeys(adapters))


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--database-url", help="server to use (needs CREATE DATABASE)")
    parser.add_argument("--jobs", type=int, default=0, help="jobs in the drain cases (20000)")
    parser.add_argument("--slots", type=int, default=10, help="daemon slots when draining (10)")
    parser.add_argument("--quick", action="store_true", help="small N: a smoke run (< 30 s)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per throughput case (1)")
    parser.add_argument("--no-fsync", action="store_true", help="embedded cluster without fsync")
    parser.add_argument("--only", nargs="+", choices=CASES, help="run only these cases")
    parser.add_argument(
        "--peers",
        type=_peer_list,
        default=[],
        help="run the side-by-side cases on jobsd and these libraries (comma-separated: "
        "pgqueuer,procrastinate; needs `uv sync --group bench`)",
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.peers and args.only and not set(args.only) <= set(SIDE_CASES):
        parser.error(f"with --peers, --only takes {', '.join(SIDE_CASES)}")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    t0 = time.perf_counter()
    log("preparing databases ..." if args.database_url else "starting Postgres ...")
    server: BenchServer | None = None
    try:
        server = BenchServer(args.database_url, fsync=not args.no_fsync)
        info = server.setup()
        text = anyio.run(run_all, args, server, info)
    finally:
        if server is not None:
            server.cleanup()
    log(f"total {time.perf_counter() - t0:.1f} s")
    print(text)


if __name__ == "__main__":
    main()
