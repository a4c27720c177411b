"""Faults of the Postgres server: restart and crash recovery (T4), stopped at enqueue
(T5), disk full (T10). The module's cluster is restarted by these tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import Producer, Scenario, connect_quietly, percentile, sized

from jobsd.dev.embedded import EmbeddedPostgres
from jobsd.ids import uuid7

pytestmark = [pytest.mark.slow]


def _restart(cluster: EmbeddedPostgres, mode: str) -> float:
    """Stop the cluster (``fast`` or ``immediate``: crash recovery) and start it again;
    return the monotonic time it accepts connections again."""
    cluster.stop(mode)
    cluster.start()
    return time.monotonic()


@pytest.mark.scenario("T4", "Postgres restart mid-run (fast, then immediate: crash recovery)")
@pytest.mark.parametrize(
    "mode", ["fast", pytest.param("immediate", marks=pytest.mark.full_campaign)]
)
@pytest.mark.timeout(120)
def test_t4_postgres_restart_under_load(
    scenario: Scenario, fault_cluster: EmbeddedPostgres, mode: str
) -> None:
    daemon = scenario.daemon(JOBSD_SLOTS="6")
    producer = Producer(
        scenario.url, sized(quick=200, full=300), pace_s=0.01, types=("work", "once"), ms=30
    )
    producer.start()
    scenario.wait_running(1)
    time.sleep(1.0)  # load on both sides: enqueues and completions in flight
    t_down = time.monotonic()
    t_up = _restart(fault_cluster, mode)
    wall_up = datetime.now(UTC)
    producer.join(90)
    assert not producer.is_alive()
    scenario.acked.update(producer.acked)
    scenario.refused.update(producer.refused)
    scenario.wait_settled(timeout_s=60)
    first = scenario.first_event_after(wall_up)
    first_ack = producer.first_ack_after(t_up)
    reconnects = daemon.count(r"\blistener\.reconnected\b")
    scenario.stop(daemon)
    audit = scenario.audit()
    amo_unrun = int(
        scenario.scalar(
            "SELECT count(*) FROM jobsd.jobs WHERE type = 'once' AND status = 'failed' "
            "AND reason = 'worker lost'"
        )
    )
    scenario.record(
        outage_s=round(t_up - t_down, 2),
        refused=len(producer.refused),
        ambiguous_resolved=len(producer.unknown),
        amo_failed_worker_lost=amo_unrun,
        enqueue_recovery_s=round(first_ack - t_up, 2) if first_ack else None,
        producer_errors=producer.errors[:3],
    )
    scenario.expect_clean(audit)
    scenario.expect(
        "recovery_s",
        round((first - wall_up).total_seconds(), 2) if first else None,
        "<=",
        5.0,
    )
    scenario.expect("listener_reconnects", reconnects, ">=", 1)
    scenario.expect_no_tracebacks(daemon)
    scenario.verdict()


async def _post_all(base: str, token: str, ids: list[str]) -> list[tuple[int, float, Any, str]]:
    """POST one job per id, all at once; return (status, seconds, body, Retry-After)."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:

        async def one(job_id: str) -> tuple[int, float, Any, str]:
            t0 = time.monotonic()
            r = await client.post(
                "/jobs",
                json={"type": "work", "id": job_id, "payload": {"ms": 1}},
                headers={"Authorization": f"Bearer {token}"},
            )
            return r.status_code, time.monotonic() - t0, r.json(), r.headers.get("retry-after", "")

        return list(await asyncio.gather(*(one(i) for i in ids)))


def _submit_while_stopped(
    scenario: Scenario, cluster: EmbeddedPostgres, count: int
) -> tuple[list[tuple[int, float, Any, str]], int, Any]:
    """Stop Postgres, POST ``count`` jobs at once, read /readyz and /health, start it."""
    token = scenario.token()
    api, base = scenario.api()
    with httpx.Client(base_url=base, timeout=10) as http:
        before = http.post(
            "/jobs", json={"type": "work"}, headers={"Authorization": f"Bearer {token}"}
        )
        assert before.status_code == 202, before.text
        scenario.acked.add(uuid.UUID(before.json()["id"]))
        cluster.stop("fast")
        try:
            ids = [str(uuid7()) for _ in range(count)]
            answers = asyncio.run(_post_all(base, token, ids))
            readyz = http.get("/readyz").status_code
            health = http.get("/health").json()
        finally:
            cluster.start()
    scenario.refused.update(uuid.UUID(i) for i in ids)
    scenario.stop(api)
    return answers, readyz, health


@pytest.mark.scenario("T5", "Postgres stopped, then 50 POST /jobs")
@pytest.mark.full_campaign
@pytest.mark.timeout(90)
def test_t5_submissions_while_postgres_is_stopped(
    scenario: Scenario, fault_cluster: EmbeddedPostgres
) -> None:
    answers, readyz, health = _submit_while_stopped(scenario, fault_cluster, 50)
    statuses = [a[0] for a in answers]
    times = [a[1] for a in answers]
    codes = sorted({a[2].get("detail", {}).get("code", "?") for a in answers if a[0] == 503})
    scenario.record(
        answer_codes=codes,
        p50_503_s=round(percentile(times, 0.5) or 0, 2),
        p99_503_s=round(percentile(times, 0.99) or 0, 2),
    )
    audit = scenario.audit(settled=False)
    scenario.expect("ghost", audit.ghost, "==", 0)
    scenario.expect("lost", audit.lost, "==", 0)
    scenario.expect("answers_202", statuses.count(202), "==", 0)
    scenario.expect("share_503", statuses.count(503) / len(statuses), "==", 1.0)
    scenario.expect("other_5xx", sum(1 for s in statuses if s >= 500 and s != 503), "==", 0)
    scenario.expect(
        "retry_after_missing", sum(1 for a in answers if a[0] == 503 and not a[3]), "==", 0
    )
    scenario.expect("readyz_while_down", readyz, "==", 503)
    scenario.expect("health_while_down", health.get("status"), "==", "unavailable")
    scenario.verdict()


@pytest.mark.scenario("T5-deadline", "Postgres stopped: time to 503 within the API deadline")
@pytest.mark.full_campaign
@pytest.mark.timeout(60)
def test_t5_503_within_the_api_deadline(
    scenario: Scenario, fault_cluster: EmbeddedPostgres
) -> None:
    answers, _, _ = _submit_while_stopped(scenario, fault_cluster, 10)
    times = [a[1] for a in answers]
    # the API's own deadline (JOBSD_READY_TIMEOUT, 2 s) plus a margin: the plan's 3 s
    scenario.expect("p99_503_s", round(percentile(times, 0.99) or 0, 2), "<=", 3.0)
    scenario.verdict()


# -- T10: disk full ---------------------------------------------------------------------

WAL_FS_SIZE = "64m"


@contextlib.contextmanager
def _wal_on_tmpfs(cluster: EmbeddedPostgres) -> Iterator[Path]:
    """Move the stopped cluster's pg_wal onto a small tmpfs owned by its OS user."""
    mount = cluster.base_dir / "walfs"
    mount.mkdir()
    st = cluster.data_dir.stat()
    opts = f"size={WAL_FS_SIZE},mode=0700,uid={st.st_uid},gid={st.st_gid}"
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for pg_wal: {result.stderr.strip() or 'not root'}")
    try:
        wal = cluster.data_dir / "pg_wal"
        for entry in wal.iterdir():
            shutil.move(str(entry), mount / entry.name)
        for path in (mount, *mount.rglob("*")):  # a copy across file systems is root's
            os.chown(path, st.st_uid, st.st_gid)
        wal.rmdir()
        wal.symlink_to(mount)
        yield mount
    finally:
        with contextlib.suppress(Exception):
            cluster.stop("immediate")
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def _fill(mount: Path, leave_bytes: int) -> Path:
    """Fill the file system but ``leave_bytes``; return the filler file."""
    filler = mount / "filler"
    free = shutil.disk_usage(mount).free - leave_bytes
    with filler.open("wb") as fh:
        chunk = b"\0" * (1 << 20)
        while free > 0:
            fh.write(chunk[: min(free, len(chunk))])
            free -= len(chunk)
    return filler


@pytest.mark.scenario("T10", "disk full: pg_wal on a 64 MB tmpfs, filled under load")
@pytest.mark.timeout(150)
def test_t10_disk_full_loses_nothing(
    make_cluster: Any, workdir: Path, figures: dict[str, Any]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    cluster: EmbeddedPostgres = make_cluster(extra_conf={"max_wal_size": "48MB"})
    cluster.stop()
    with _wal_on_tmpfs(cluster) as mount:
        cluster.start()
        from jobsd.store.migrate import migrate_sync

        migrate_sync(cluster.url())
        scenario = Scenario(cluster.url(), workdir, figures)
        try:
            _disk_full(scenario, cluster, mount)
        finally:
            scenario.close()


def _disk_full(scenario: Scenario, cluster: EmbeddedPostgres, mount: Path) -> None:
    daemon = scenario.daemon(JOBSD_SLOTS="6")
    producer = Producer(
        scenario.url,
        100_000,
        pace_s=0.002,
        types=("work", "once"),
        ms=5,
        pad_bytes=4096,
        deadline_s=120,
    )
    producer.start()
    scenario.wait_running(1)
    filler = _fill(mount, leave_bytes=256 * 1024)
    t_full = time.monotonic()
    # WAL keeps growing until a new segment cannot be created: force switches
    while time.monotonic() - t_full < 30 and len(producer.refused) + len(producer.unknown) < 5:
        conn = connect_quietly(scenario.url)
        if conn is not None:
            with conn, contextlib.suppress(Exception):
                conn.execute("SELECT pg_switch_wal()")
        time.sleep(0.2)
    refused_while_full = len(producer.refused)
    crashed = not cluster.running
    filler.unlink()
    t_free = time.monotonic()
    if not cluster.running:
        cluster.start()
    else:  # still up (or recovering): a restart, as the plan says
        with contextlib.suppress(Exception):
            cluster.stop("fast")
        cluster.start()
    t_up = time.monotonic()
    time.sleep(2)
    producer.stop_flag.set()
    producer.join(60)
    scenario.acked.update(producer.acked)
    scenario.refused.update(producer.refused)
    scenario.wait_settled(timeout_s=90)
    first_ack = producer.first_ack_after(t_up)
    scenario.stop(daemon)
    audit = scenario.audit()
    log_tail = cluster.log_file.read_text(errors="replace")
    scenario.record(
        acked=len(producer.acked),
        refused_while_full=refused_while_full,
        ambiguous_resolved=len(producer.unknown),
        postgres_crashed=crashed,
        panics=log_tail.count("PANIC"),
        no_space_errors=log_tail.count("No space left on device"),
        restart_s=round(t_up - t_free, 2),
        producer_errors=producer.errors[:3],
    )
    scenario.expect_clean(audit)
    scenario.expect("refusals_seen", refused_while_full + len(producer.unknown), ">=", 1)
    scenario.expect("recovery_s", round(first_ack - t_free, 2) if first_ack else None, "<=", 5.0)
    scenario.expect_no_tracebacks(daemon)
    scenario.verdict()
