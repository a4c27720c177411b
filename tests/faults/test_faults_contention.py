"""Contention: a long transaction elsewhere (T9), the duplicate-enqueue race (T12), the
claim race with its mutation check (T13), NOTIFY queue pressure (T20)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import threading
import time
import uuid
from collections import Counter
from typing import Any

import httpx
import psycopg
import pytest
from harness import Producer, Scenario, sized
from support.claims import claim_params

from jobsd.dev.embedded import find_bindir
from jobsd.store.migrate import migrate_sync
from jobsd.store.named import sql_text

pytestmark = [pytest.mark.slow]


# -- T9: a long transaction elsewhere -------------------------------------------------------


def _claims_per_s(scenario: Scenario, start: Any, end: Any) -> float:
    n = scenario.scalar(
        "SELECT count(*) FROM jobsd.all_job_events WHERE to_status = 'running' AND at >= %s "
        "AND at < %s",
        (start, end),
    )
    return round(int(n) / max((end - start).total_seconds(), 1e-3), 1)


def _jobsd_idle_in_transaction(scenario: Scenario) -> int:
    return int(
        scenario.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'jobsd-%%' AND state LIKE 'idle in transaction%%' "
            "AND clock_timestamp() - state_change > interval '1 second'"
        )
    )


def _dead_tuples(scenario: Scenario) -> int:
    return int(
        scenario.scalar(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'jobsd.jobs'::regclass"
        )
        or 0
    )


@pytest.mark.scenario("T9", "a long transaction elsewhere holds the xmin horizon")
@pytest.mark.full_campaign
@pytest.mark.timeout(120)
def test_t9_long_transaction_elsewhere(scenario: Scenario) -> None:
    hold_s = 15.0
    daemon = scenario.daemon(JOBSD_SLOTS="8", JOBSD_HTTP_ADDR="127.0.0.1:0")
    api = daemon.wait_for(r"\bapi\.listening\b.*addr=(\S+)").group(1)
    producer = Producer(scenario.url, 100_000, pace_s=0.004, ms=5, deadline_s=2 * hold_s + 10)
    producer.start()
    time.sleep(3)
    t0 = scenario.db_now()
    time.sleep(hold_s / 2)
    t1 = scenario.db_now()
    dead_before = _dead_tuples(scenario)
    idle_samples = []
    with psycopg.connect(scenario.url) as blocker:  # not autocommit: BEGIN is implicit
        blocker.execute("SELECT txid_current()")
        held_from = time.monotonic()
        while time.monotonic() - held_from < hold_s:
            idle_samples.append(_jobsd_idle_in_transaction(scenario))
            time.sleep(0.25)
        t2 = scenario.db_now()
        health = httpx.get(f"http://{api}/health", timeout=10).json()
        dead_during = _dead_tuples(scenario)
        blocker.rollback()
    producer.stop_flag.set()
    producer.join(30)
    scenario.acked.update(producer.acked)
    scenario.wait_settled(timeout_s=60)
    scenario.stop(daemon)
    audit = scenario.audit()
    before, during = _claims_per_s(scenario, t0, t1), _claims_per_s(scenario, t1, t2)
    scenario.record(
        claims_per_s_before=before,
        claims_per_s_during=during,
        throughput_change=f"{(during - before) / before:+.0%}" if before else None,
        dead_tuples_growth=dead_during - dead_before,
        hold_s=hold_s,
        health_warnings=health.get("warnings", [])[:2],
    )
    scenario.expect_clean(audit)
    scenario.expect("jobsd_idle_in_transaction", max(idle_samples), "==", 0)
    age = health.get("oldest_xact_age_s")
    scenario.expect(
        "health_oldest_xact_age_s", round(age, 1) if age is not None else None, ">=", hold_s - 2
    )
    scenario.verdict()


# -- T12: duplicate-enqueue race ----------------------------------------------------------


async def _race(
    base: str, tokens: dict[str, str], keys: int, fan: int
) -> list[tuple[str, str, int, str]]:
    """For each key: ``fan`` concurrent POSTs with it from org A, then one from org B."""
    answers: list[tuple[str, str, int, str]] = []
    limits = httpx.Limits(max_connections=fan, max_keepalive_connections=fan)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:

        async def post(org: str, key: str) -> None:
            r = await client.post(
                "/jobs",
                json={"type": "work", "dedup_key": key, "payload": {"org": org}},
                headers={"Authorization": f"Bearer {tokens[org]}"},
            )
            answers.append((org, key, r.status_code, r.json().get("id", "")))

        for k in range(keys):
            key = f"race-{k}"
            await asyncio.gather(*(post("acme", key) for _ in range(fan)))
            await post("globex", key)
    return answers


@pytest.mark.scenario("T12", "duplicate-enqueue race: 20 concurrent POSTs per dedup key")
@pytest.mark.timeout(120)
def test_t12_duplicate_enqueue_race(scenario: Scenario) -> None:
    keys, fan = sized(quick=10, full=50), 20
    tokens = {org: scenario.token(org) for org in ("acme", "globex")}
    api, base = scenario.api(JOBSD_POOL_SIZE="8")
    t0 = time.monotonic()
    answers = asyncio.run(_race(base, tokens, keys, fan))
    took = time.monotonic() - t0
    scenario.stop(api)
    rows = scenario.rows("SELECT org_id, dedup_key, id FROM jobsd.jobs")
    per_key = Counter((org, key) for org, key, _ in rows)
    ids = {
        (org, key): {a[3] for a in answers if a[0] == org and a[1] == key} for org, key in per_key
    }
    acme_ids = {key: i for (org, key), i in ids.items() if org == "acme"}
    globex_ids = {key: i for (org, key), i in ids.items() if org == "globex"}
    scenario.acked.update(uuid.UUID(a[3]) for a in answers if a[2] == 202)
    audit = scenario.audit(settled=False)
    scenario.record(requests=len(answers), requests_per_s=round(len(answers) / took))
    scenario.expect("non_202", sum(1 for a in answers if a[2] != 202), "==", 0)
    scenario.expect("rows_per_key_max", max(per_key.values()), "==", 1)
    scenario.expect("rows", len(rows), "==", 2 * keys)
    scenario.expect("distinct_ids_per_key_max", max(len(v) for v in ids.values()), "==", 1)
    scenario.expect(
        "cross_org_conflicts",
        sum(1 for k, v in globex_ids.items() if v & acme_ids.get(k, set())),
        "==",
        0,
    )
    scenario.expect("lost", audit.lost, "==", 0)
    scenario.expect("illegal", audit.illegal, "==", 0)
    scenario.verdict()


# -- T13: claim race and its mutation -------------------------------------------------------

CLAIM_LOCK = "FOR UPDATE OF j SKIP LOCKED"


def _claim_race(url: str, query: str, claimers: int, batch: int) -> tuple[Counter[Any], float]:
    """Claim with ``claimers`` threads until nothing is left; count claims per job."""
    claims: Counter[Any] = Counter()
    lock = threading.Lock()
    params = claim_params(batch)

    def claimer(n: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                rows = conn.execute(query, {**params, "worker_id": f"race:{n}"}).fetchall()
                if not rows:
                    return
                with lock:
                    claims.update(r[0] for r in rows)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(claimers)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return claims, time.monotonic() - t0


@pytest.mark.scenario("T13", "claim race: 2 daemons x 8 slots on 2,000 jobs; mutation check")
@pytest.mark.full_campaign
@pytest.mark.timeout(180)
def test_t13_claim_race(scenario: Scenario) -> None:
    total = 2000
    scenario.enqueue_bulk(total, ms=0)
    daemons = [scenario.daemon(ready=False, JOBSD_SLOTS="8") for _ in range(2)]
    t0 = time.monotonic()
    drained = scenario.wait_settled(timeout_s=120)
    for d in daemons:
        scenario.stop(d)
    audit = scenario.audit()
    per_daemon = Counter(r.pid for runs in scenario.runs().values() for r in runs)
    scenario.record(
        daemon_claims_per_s=round(total / drained),
        share_per_daemon=sorted(per_daemon.values()),
        startup_to_drain_s=round(time.monotonic() - t0, 1),
    )
    scenario.expect_clean(audit)
    scenario.expect("double_claims", audit.double_runs, "==", 0)

    # the same race on the statement itself: the real one, then one without its row locks
    real = sql_text("jobs_claim_batch")
    assert CLAIM_LOCK in real, "the claim statement changed: update the mutation"
    with psycopg.connect(scenario.url, autocommit=True) as conn:
        conn.execute("DELETE FROM jobsd.jobs")
    results = {}
    for name, query in (("real", real), ("mutant", real.replace(CLAIM_LOCK, ""))):
        scenario.enqueue_bulk(1500, ms=0)
        claims, took = _claim_race(scenario.url, query, claimers=8, batch=8)
        results[name] = (
            sum(1 for n in claims.values() if n > 1),
            round(sum(claims.values()) / took),
        )
        with psycopg.connect(scenario.url, autocommit=True) as conn:
            conn.execute("DELETE FROM jobsd.jobs")
    scenario.record(
        statement_claims_per_s=results["real"][1], mutant_double_claimed=results["mutant"][0]
    )
    scenario.expect("statement_double_claims", results["real"][0], "==", 0)
    scenario.expect("mutation_detected", results["mutant"][0] > 0, "==", True)
    scenario.verdict()


# -- T20: NOTIFY pressure ----------------------------------------------------------------


def _postgres_major() -> int:
    """Return the major version of the Postgres binaries the clusters run."""
    out = subprocess.run(
        [str(find_bindir() / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"\(PostgreSQL\) (\d+)", out)
    assert match is not None, out
    return int(match.group(1))


@pytest.mark.scenario("T20", "NOTIFY queue pressure (max_notify_queue_pages, PG >= 17)")
@pytest.mark.full_campaign
@pytest.mark.timeout(180)
def test_t20_notify_queue_full(make_cluster: Any, workdir: Any, figures: dict[str, Any]) -> None:
    if _postgres_major() < 17:
        pytest.skip(
            "PG < 17: the NOTIFY queue is 8 GB and max_notify_queue_pages does not exist; "
            "only the usage gauge is checked (T20-gauge)"
        )
    # not run on the machine class of docs/reliability.md (Postgres 15): unverified
    cluster = make_cluster(extra_conf={"max_notify_queue_pages": "64"})
    migrate_sync(cluster.url())
    scenario = Scenario(cluster.url(), workdir, figures)
    try:
        with psycopg.connect(scenario.url) as stalled:  # LISTEN, then a transaction left open
            stalled.execute("LISTEN jobsd")
            stalled.commit()
            stalled.execute("SELECT 1")
            producer = Producer(scenario.url, 40_000, pace_s=0, ms=0, deadline_s=120)
            producer.run()  # in this thread: until the deadline or the count
            usage = float(scenario.scalar("SELECT pg_notification_queue_usage()"))
            stalled.rollback()
        scenario.acked.update(producer.acked)
        scenario.refused.update(producer.refused)
        audit = scenario.audit(settled=False)
        attempted = len(producer.acked) + len(producer.refused)
        scenario.record(notify_queue_usage=usage, refused=len(producer.refused))
        scenario.expect("queue_filled", len(producer.refused) + len(producer.errors), ">=", 1)
        scenario.expect("ghost", audit.ghost, "==", 0)
        scenario.expect("lost", audit.lost, "==", 0)
        scenario.record(enqueue_availability=round(len(producer.acked) / max(attempted, 1), 3))
        scenario.verdict()
    finally:
        scenario.close()


@pytest.mark.scenario("T20-gauge", "NOTIFY queue usage visible while a listener stalls it")
@pytest.mark.full_campaign
@pytest.mark.timeout(60)
def test_t20_notify_queue_usage_is_exposed(scenario: Scenario) -> None:
    daemon = scenario.daemon(JOBSD_HTTP_ADDR="127.0.0.1:0", JOBSD_SLOTS="8")
    api = daemon.wait_for(r"\bapi\.listening\b.*addr=(\S+)").group(1)
    with psycopg.connect(scenario.url) as stalled:  # LISTEN, then a transaction left open
        stalled.execute("LISTEN jobsd")
        stalled.commit()
        stalled.execute("SELECT 1")
        scenario.enqueue(300, ms=0)
        usage = float(scenario.scalar("SELECT pg_notification_queue_usage()"))
        metrics = httpx.get(f"http://{api}/metrics", timeout=10).text
        health = httpx.get(f"http://{api}/health", timeout=10).text
        stalled.rollback()
    scenario.wait_settled(timeout_s=30)
    scenario.stop(daemon)
    scenario.record(notify_queue_usage=usage)
    scenario.expect("usage_above_zero", usage > 0, "==", True)
    exposed = "notification_queue" in metrics or "notify_queue" in health
    scenario.expect("usage_exposed", exposed, "==", True)
    scenario.verdict()
