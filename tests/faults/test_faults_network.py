"""Faults between jobsd and Postgres: an ambiguous commit (T6), a network cut by a veth
link taken down (T7a) and by an application-level blackhole (T7b), the LISTEN session
killed and NOTIFY off (T8)."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from e2e.conftest import run_cli
from harness import Scenario, percentile, sized, via
from netns import VethLink
from proxy import Proxy

from jobsd.dev.embedded import EmbeddedPostgres
from jobsd.ids import uuid7
from jobsd.store.migrate import migrate_sync

pytestmark = [pytest.mark.slow]

# what a daemon logs when it notices that the database is unreachable
DB_TROUBLE = (
    r"\b(db\.retrying|db\.no_answer|heartbeat\.failed|listener\.lost|sweeper\.failed|"
    r"worker\.connection_lost|completer\.)"
)


# -- T6: ambiguous commit -----------------------------------------------------------------

INSERT = b"INSERT INTO jobsd.jobs "


@pytest.mark.scenario("T6", "ambiguous commit: the INSERT commits, its answer is lost")
@pytest.mark.full_campaign
@pytest.mark.timeout(120)
def test_t6_ambiguous_commit_creates_no_ghost_and_no_duplicate(
    scenario: Scenario, proxy: Proxy
) -> None:
    token = scenario.token()
    api, base = scenario.api(url=via(scenario.url, "127.0.0.1", proxy.port))
    headers = {"Authorization": f"Bearer {token}"}
    answered: set[uuid.UUID] = set()
    first_answers: list[tuple[int, str]] = []
    cases = [(with_id, drops) for with_id in (True, False) for drops in (1, 3) for _ in range(5)]
    with httpx.Client(base_url=base, timeout=30) as http:
        for n, (with_id, drops) in enumerate(cases):
            body: dict[str, Any] = {"type": "work", "dedup_key": f"k{n}", "payload": {"n": n}}
            if with_id:
                body["id"] = str(uuid7())
            # drops=1: the API's own retry (same id) finds the committed job;
            # drops=3: every attempt is ambiguous: 503 outcome_unknown, the client retries
            proxy.arm_ambiguous(INSERT, drops)
            r = http.post("/jobs", json=body, headers=headers)
            code = r.json().get("detail", {}).get("code", "") if r.status_code != 202 else ""
            first_answers.append((r.status_code, code))
            proxy.arm_ambiguous(b"", 0)
            for _ in range(5):  # the client's retry, with the same body
                if r.status_code == 202:
                    break
                time.sleep(0.2)
                r = http.post("/jobs", json=body, headers=headers)
            assert r.status_code == 202, r.text
            answered.add(uuid.UUID(r.json()["id"]))
    scenario.stop(api)
    rows = scenario.rows("SELECT id, dedup_key FROM jobsd.jobs")
    per_key: dict[str, int] = {}
    for _, key in rows:
        per_key[key] = per_key.get(key, 0) + 1
    ambiguous = [a for a, (_, drops) in zip(first_answers, cases, strict=True) if drops == 1]
    scenario.acked.update(answered)
    audit = scenario.audit(settled=False)
    scenario.record(
        submissions=len(cases),
        answers_cut=proxy.triggered,
        first_answers=sorted({f"{s} {c}".strip() for s, c in first_answers}),
        resolved_share=round(sum(1 for s, _ in ambiguous if s == 202) / len(ambiguous), 2),
    )
    scenario.expect("answers_cut", proxy.triggered, ">=", len(cases))
    scenario.expect("ghost", len({r[0] for r in rows} - answered), "==", 0)
    scenario.expect("duplicate_rows", sum(n - 1 for n in per_key.values()), "==", 0)
    scenario.expect("rows", len(rows), "==", len(cases))
    scenario.expect("lost", audit.lost, "==", 0)
    scenario.expect(
        "other_than_202_or_outcome_unknown",
        sum(1 for s, c in first_answers if s != 202 and c != "outcome_unknown"),
        "==",
        0,
    )
    scenario.expect("illegal", audit.illegal, "==", 0)
    scenario.verdict()


# -- T7: network cut -------------------------------------------------------------------


def _outage_s() -> float:
    """The plan's 10 s; 6 s in the quick subset (still twice the lease)."""
    return float(sized(quick=6, full=10))


def _partition(
    scenario: Scenario,
    *,
    url_a: str,
    cut: Callable[[], None],
    heal: Callable[[], None],
    prefix: tuple[str, ...] = (),
) -> None:
    """Daemon A loses Postgres for a while (``_outage_s``) while daemon B keeps it; then A
    gets it back.

    A cannot renew its lease: its fence stops its runs at two thirds of it (R written
    back queued, AMO failed, once the link heals). B rescues what is left once A's lease
    ended more than L ago (A's lock is still held by its session, which the server does
    not know is cut off). No run of A overlaps a run of B.
    """
    scenario.enqueue(sized(quick=32, full=64), types=("work", "once"), ms=1500)
    a = scenario.daemon(url=url_a, prefix=prefix, JOBSD_SLOTS="4")
    b = scenario.daemon(JOBSD_SLOTS="4")
    scenario.wait_running(4, worker_pid=a.pid)
    t_cut = time.monotonic()
    outage_s = _outage_s()
    cut()
    try:
        time.sleep(outage_s)
    finally:
        heal()
    t_heal = time.monotonic()
    heal_wall = scenario.db_now()
    scenario.wait_settled(timeout_s=90)
    detected = a.first_line_after(DB_TROUBLE, t_cut)
    recovered = scenario.first_event_after(heal_wall, worker_pid=a.pid)
    for proc in (a, b):
        scenario.stop(proc)
    audit = scenario.audit()
    swept = int(
        scenario.scalar(
            "SELECT count(*) FROM jobsd.all_job_events "
            "WHERE reason IN ('owner unresponsive', 'worker lost')"
        )
    )
    scenario.record(
        detection_s=round(detected - t_cut, 2) if detected is not None else None,
        detected_during_outage=detected is not None and detected < t_heal,
        swept_from_cut_daemon=swept,
        outage_s=outage_s,
    )
    scenario.expect_clean(audit)
    scenario.expect(
        "recovery_s",
        round((recovered - heal_wall).total_seconds(), 2) if recovered else None,
        "<=",
        5.0,
    )
    scenario.expect_no_tracebacks(a)
    scenario.verdict()


@pytest.fixture
def veth() -> Iterator[VethLink]:
    """A namespace and a veth link to it (skips without root)."""
    link = VethLink.create()
    try:
        yield link
    finally:
        link.remove()


def _cluster_on(make_cluster: Any, link: VethLink) -> EmbeddedPostgres:
    """Start a cluster that also listens on the host's end of the link."""
    cluster: EmbeddedPostgres = make_cluster(
        extra_conf={"listen_addresses": f"127.0.0.1,{link.host_ip}"},
        hba_lines=[
            "local all all trust",
            "host all all 127.0.0.1/32 trust",
            f"host all all {link.subnet} trust",
        ],
    )
    migrate_sync(cluster.url())
    return cluster


@pytest.mark.scenario("T7a", "network cut: veth link down for 10 s (daemon in a netns)")
@pytest.mark.full_campaign
@pytest.mark.timeout(150)
def test_t7a_link_down(
    make_cluster: Any, veth: VethLink, workdir: Any, figures: dict[str, Any]
) -> None:
    cluster = _cluster_on(make_cluster, veth)
    scenario = Scenario(cluster.url(), workdir, figures)
    try:
        _partition(
            scenario,
            url_a=via(cluster.url(), veth.host_ip, cluster.port),
            prefix=veth.prefix,
            cut=veth.down,
            heal=veth.up,
        )
    finally:
        scenario.close()


@pytest.mark.scenario("T7b", "network cut: application-level blackhole for 10 s (proxy)")
@pytest.mark.timeout(150)
def test_t7b_blackhole(scenario: Scenario, proxy: Proxy) -> None:
    _partition(
        scenario,
        url_a=via(scenario.url, "127.0.0.1", proxy.port),
        cut=proxy.blackhole,
        heal=proxy.heal,
    )


@pytest.mark.scenario("T7-detect", "network cut: the daemon notices within 5 s")
@pytest.mark.full_campaign
@pytest.mark.timeout(60)
def test_t7_detects_a_partition_within_5_s(scenario: Scenario, proxy: Proxy) -> None:
    scenario.enqueue(8, types=("work",), ms=3000)
    daemon = scenario.daemon(url=via(scenario.url, "127.0.0.1", proxy.port))
    scenario.wait_running(4, worker_pid=daemon.pid)
    t_cut = time.monotonic()
    proxy.blackhole()
    detected = None
    try:
        deadline = t_cut + 6.0
        while time.monotonic() < deadline and detected is None:
            time.sleep(0.1)
            detected = daemon.first_line_after(DB_TROUBLE, t_cut)
    finally:
        proxy.heal(close=True)
    scenario.expect(
        "detection_s", round(detected - t_cut, 2) if detected is not None else None, "<=", 5.0
    )
    scenario.verdict()


# -- T8: LISTEN killed, NOTIFY off --------------------------------------------------------

POLL_S = 2.0
# jobsd jitters each poll wait to 2/3..4/3 of the interval: a lost wake-up costs at most
# 4/3 of it (the plan's bound, interval + 0.5 s, assumes no jitter)
PICKUP_BOUND_S = POLL_S * 4 / 3 + 0.5


def _pickup_s(scenario: Scenario, job_id: uuid.UUID, t_enqueued: float) -> float:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        runs = scenario.runs().get(str(job_id))
        if runs:
            return runs[0].start_mono - t_enqueued
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} not picked up within 15 s")


@pytest.mark.scenario("T8", "LISTEN session killed, then NOTIFY off: pickup by polling")
@pytest.mark.full_campaign
@pytest.mark.timeout(120)
def test_t8_listen_killed_and_notify_off(scenario: Scenario, rng: random.Random) -> None:
    daemon = scenario.daemon(JOBSD_POLL_INTERVAL=str(POLL_S), JOBSD_SLOTS="2")
    killed_latencies = []
    kills = 6
    for _ in range(kills):
        time.sleep(rng.uniform(0.2, 1.0))
        terminated = scenario.scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'jobsd-listen' AND datname = current_database()"
        )
        assert terminated == 1
        t0 = time.monotonic()
        (job_id,) = scenario.enqueue(1, ms=10)
        killed_latencies.append(_pickup_s(scenario, job_id, t0))
    reconnects = daemon.count(r"\blistener\.reconnected\b")

    result = run_cli("notify", "off", env=scenario.env())
    assert result.returncode == 0, result.stderr
    silent_latencies = []
    for _ in range(8):
        time.sleep(rng.uniform(0.1, POLL_S))
        t0 = time.monotonic()
        (job_id,) = scenario.enqueue(1, ms=10)
        silent_latencies.append(_pickup_s(scenario, job_id, t0))
    scenario.stop(daemon)
    audit = scenario.audit()
    scenario.record(
        pickup_p50_after_kill_s=round(percentile(killed_latencies, 0.5) or 0, 2),
        pickup_p50_notify_off_s=round(percentile(silent_latencies, 0.5) or 0, 2),
        poll_interval_s=POLL_S,
    )
    scenario.expect_clean(audit)
    scenario.expect(
        "pickup_p99_after_kill_s",
        round(percentile(killed_latencies, 0.99) or 0, 2),
        "<=",
        PICKUP_BOUND_S,
    )
    scenario.expect(
        "pickup_p99_notify_off_s",
        round(percentile(silent_latencies, 0.99) or 0, 2),
        "<=",
        PICKUP_BOUND_S,
    )
    scenario.expect("listener_reconnects", reconnects, "==", kills)
    scenario.verdict()
