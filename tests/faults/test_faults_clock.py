"""Clock jumps (T11): (a) the daemon's clock jumps +1 h then -1 h; (b) the database's
clock jumps forward by 2 x L while jobs run.

Both use libfaketime (Debian package ``faketime``) with an offset read from a file the
test rewrites (``FAKETIME_TIMESTAMP_FILE``). ``FAKETIME_DONT_FAKE_MONOTONIC=1`` keeps
CLOCK_MONOTONIC real: it never jumps on a real machine. (With it, libfaketime 0.9.10
makes Python's ``time.sleep`` fail with EINVAL; asyncio, which the daemon runs on, does
not use it.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from harness import LEASE_S, Scenario, sized

from jobsd.client import SyncClient
from jobsd.dev.embedded import EmbeddedPostgres
from jobsd.store.migrate import migrate_sync

pytestmark = [pytest.mark.slow]

LIBFAKETIME = [
    Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"),
    Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"),
    Path("/usr/lib/faketime/libfaketimeMT.so.1"),
]
RESCUES = ("owner unresponsive", "owner died", "worker lost")


def _libfaketime() -> Path:
    for path in LIBFAKETIME:
        if path.exists():
            return path
    pytest.skip("libfaketime is not installed (apt-get install -y faketime)")


class FakeClock:
    """An offset file that libfaketime reads at every call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.set("+0")
        path.chmod(0o644)

    def env(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": str(_libfaketime()),
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            # every call reads the offset: all processes see a jump at the same moment
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def set(self, offset: str) -> None:
        """Set the offset (``+1h``, ``-1h``, ``+6``...)."""
        self.path.write_text(offset + "\n")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.scenario("T11a", "the daemon's clock jumps +1 h, then -1 h (faketime)")
@pytest.mark.timeout(120)
def test_t11a_daemon_clock_jumps(scenario: Scenario) -> None:
    clock = FakeClock(scenario.workdir / "daemon-offset")
    scenario.enqueue(sized(quick=24, full=48), types=("work", "once"), ms=1500)
    # a job due later: the daemon computes when to promote it from its own clock
    with SyncClient(scenario.url) as client:
        later = client.enqueue(
            "work", {"ms": 10}, org_id="acme", run_after=datetime.now(UTC) + timedelta(seconds=8)
        )
    scenario.acked.add(later.id)
    skewed = scenario.spawn("run", env={**scenario.env(), **clock.env()})
    skewed.wait_ready(timeout_s=30)
    steady = scenario.daemon()
    scenario.wait_running(4, worker_pid=skewed.pid)
    cpu = {}
    window_s = float(sized(quick=2, full=3))
    for offset in ("+0", "+1h", "-1h"):
        clock.set(offset)
        time.sleep(0.5)
        c0 = _cpu_s(skewed.pid)
        time.sleep(window_s)
        cpu[offset] = round((_cpu_s(skewed.pid) - c0) / window_s, 2)
    clock.set("+0")
    scenario.wait_settled(timeout_s=90)
    for proc in (skewed, steady):
        scenario.stop(proc)
    audit = scenario.audit()
    events = scenario.events()
    spurious = [e for e in events if e["reason"] in RESCUES]
    amo_failed = scenario.count_status("failed")
    scenario.record(
        daemon_cpu_share={k: v for k, v in cpu.items()},
        later_job=scenario.scalar("SELECT status FROM jobsd.jobs WHERE id = %s", (later.id,)),
    )
    scenario.expect_clean(audit)
    scenario.expect("spurious_sweeps", len(spurious), "==", 0)
    scenario.expect("amo_wrongly_failed", amo_failed, "==", 0)
    scenario.expect("r_reruns", audit.runs - audit.jobs, "==", 0)
    scenario.verdict()


def _commits(scenario: Scenario) -> int:
    return int(
        scenario.scalar(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
    )


@pytest.mark.scenario("T11a-spin", "the daemon's clock +1 h with a job due later: no busy loop")
@pytest.mark.full_campaign
@pytest.mark.timeout(60)
def test_t11a_a_clock_ahead_does_not_spin_the_claimer(scenario: Scenario) -> None:
    clock = FakeClock(scenario.workdir / "daemon-offset")
    with SyncClient(scenario.url) as client:
        client.enqueue(
            "work", {"ms": 10}, org_id="acme", run_after=datetime.now(UTC) + timedelta(minutes=5)
        )
    skewed = scenario.spawn("run", env={**scenario.env(), **clock.env()})
    skewed.wait_ready(timeout_s=30)
    cpu, rate = {}, {}
    for offset in ("+0", "+1h"):
        clock.set(offset)
        time.sleep(2.2)
        c0, x0 = _cpu_s(skewed.pid), _commits(scenario)
        time.sleep(4)
        cpu[offset] = round((_cpu_s(skewed.pid) - c0) / 4, 2)
        rate[offset] = round((_commits(scenario) - x0) / 4, 1)
    clock.set("+0")
    scenario.stop(skewed)
    scenario.record(daemon_cpu_share=cpu, statements_per_s_idle=rate["+0"], poll_interval_s=0.5)
    # an idle daemon polls every 0.5 s (a claim and a promotion): a few statements a second
    scenario.expect("statements_per_s_clock_ahead", rate["+1h"], "<=", max(10.0, 3 * rate["+0"]))
    scenario.verdict()


@contextmanager
def _faked_cluster(make_cluster: Any, clock: FakeClock) -> Iterator[EmbeddedPostgres]:
    """Start a cluster whose processes inherit libfaketime (only the postmaster's env)."""
    saved = {k: os.environ.get(k) for k in clock.env()}
    os.environ.update(clock.env())
    try:
        cluster: EmbeddedPostgres = make_cluster()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield cluster


@pytest.mark.scenario("T11b", "the database's clock jumps forward by 2 x L while jobs run")
@pytest.mark.full_campaign
@pytest.mark.timeout(120)
def test_t11b_database_clock_jump(
    make_cluster: Any, workdir: Path, figures: dict[str, Any]
) -> None:
    clock = FakeClock(workdir / "db-offset")
    with _faked_cluster(make_cluster, clock) as cluster:
        migrate_sync(cluster.url())
        scenario = Scenario(cluster.url(), workdir, figures)
        try:
            # enqueued once both daemons claim: one ready 8 s after the other (a loaded
            # machine) would find its share of the jobs already run by the first
            daemons = [scenario.daemon(JOBSD_SLOTS="4") for _ in range(2)]
            scenario.enqueue(8, types=("work", "once"), ms=8000)
            scenario.wait_running(8)
            time.sleep(1.5)
            clock.set(f"+{2 * LEASE_S:g}")
            time.sleep(4)
            scenario.wait_settled(timeout_s=60)
            for proc in daemons:
                scenario.stop(proc)
            audit = scenario.audit()
            spurious = [e for e in scenario.events() if e["reason"] in RESCUES]
            scenario.record(
                amo_wrongly_failed=sum(1 for e in spurious if e["reason"] == "worker lost"),
                r_reruns=audit.runs - audit.jobs,
                jump_s=2 * LEASE_S,
            )
            scenario.expect_clean(audit)
            scenario.expect("spurious_sweeps", len(spurious), "==", 0)
            scenario.verdict()
        finally:
            scenario.close()
