"""Faults of the daemon process: kill -9 (T1), SIGTERM drain (T2), SIGSTOP (T3).

Lease L = 3 s (heartbeat 1 s, sweep and death check every 1 s). Two daemons share one
queue unless said otherwise; the ledger is the truth about what ran.
"""

from __future__ import annotations

import random
import signal
import time
from datetime import timedelta

import pytest
from harness import LEASE_S, Scenario, sized

from jobsd.worker.fence import BREACH_EXIT_STATUS

pytestmark = [pytest.mark.slow]


@pytest.mark.scenario("T1", "kill -9 of a daemon mid-job; the other takes over")
@pytest.mark.timeout(90)
def test_t1_kill_9_mid_job(scenario: Scenario, rng: random.Random) -> None:
    scenario.enqueue(
        sized(quick=120, full=240), types=("work", "once"), ms=lambda n: rng.randint(10, 200)
    )
    victim = scenario.daemon(ready=False)
    survivor = scenario.daemon(ready=False)
    victim.wait_ready()
    survivor.wait_ready()
    scenario.wait_running(4, worker_pid=victim.pid)
    time.sleep(rng.uniform(0, 0.3))
    kill_wall = scenario.db_now()
    t_kill = scenario.kill(victim)
    in_flight = scenario.count_status("running", worker_pid=victim.pid)

    scenario.wait_settled(timeout_s=60)
    scenario.stop(survivor)
    audit = scenario.audit()

    events = scenario.events()
    rescued = {e["job_id"]: e for e in events if e["reason"] == "owner died"}
    lost_amo = {e["job_id"]: e for e in events if e["reason"] == "worker lost"}
    runs = scenario.runs()
    # a lost job is recovered when it runs again (R) or is failed for good (AMO)
    recovered_s = [(e["at"] - kill_wall).total_seconds() for e in lost_amo.values()]
    for job_id in rescued:
        again = [r.start_mono - t_kill for r in runs.get(str(job_id), []) if r.start_mono > t_kill]
        recovered_s.append(min(again) if again else float("inf"))
    rescue_s = [
        (e["at"] - kill_wall).total_seconds() for e in (*rescued.values(), *lost_amo.values())
    ]
    scenario.record(in_flight_at_kill=in_flight, requeued=len(rescued), amo_failed=len(lost_amo))
    scenario.expect_clean(audit)
    scenario.expect("in_flight_at_kill", in_flight, ">=", 1)
    scenario.expect("rescue_s", round(max(rescue_s), 2) if rescue_s else None, "<=", LEASE_S + 2)
    scenario.expect(
        "recovery_s", round(max(recovered_s), 2) if recovered_s else None, "<=", LEASE_S + 2
    )
    scenario.expect(
        "r_reruns_per_kill", max((len(r) - 1 for r in runs.values()), default=0), "<=", 1
    )
    scenario.verdict()


def _drain(scenario: Scenario, *, grace_s: float, twice: bool, tag: str = "") -> None:
    daemon = scenario.daemon(JOBSD_DRAIN_TIMEOUT=str(grace_s), JOBSD_SLOTS="4")
    scenario.wait_running(4, worker_pid=daemon.pid)
    term_wall = scenario.db_now()
    t_term = time.monotonic()
    daemon.send(signal.SIGTERM)
    if twice:
        daemon.wait_for(r"\bdaemon\.stopping\b")
        time.sleep(0.5)
        daemon.send(signal.SIGTERM)
    code = daemon.wait(grace_s + 15)
    drain_s = time.monotonic() - t_term
    events = scenario.events()
    late_claims = [
        e
        for e in events
        if e["to_status"] == "running"
        and e["from_status"] == "queued"
        and e["at"] > term_wall + timedelta(seconds=0.2)
    ]
    running_left = scenario.count_status("running")
    written_back = [e for e in events if e["reason"] == "shutdown"]
    scenario.record(
        **{
            f"{tag}written_back": len(written_back),
            f"{tag}written_back_to": sorted({e["to_status"] for e in written_back}),
        }
    )
    scenario.expect(f"{tag}new_claims_after_sigterm", len(late_claims), "==", 0)
    scenario.expect(f"{tag}exit_code", code, "==", 0)
    # a second signal skips the rest of the grace period
    scenario.expect(f"{tag}drain_s", round(drain_s, 2), "<=", 2.0 if twice else grace_s + 1)
    scenario.expect(f"{tag}running_without_owner", running_left, "==", 0)
    scenario.expect_no_tracebacks(daemon, f"{tag}tracebacks")


@pytest.mark.scenario("T2a", "SIGTERM with jobs shorter than the grace period")
@pytest.mark.full_campaign
@pytest.mark.timeout(60)
def test_t2a_sigterm_drains_short_jobs(scenario: Scenario) -> None:
    scenario.enqueue(40, types=("work", "once"), ms=800)
    _drain(scenario, grace_s=5, twice=False)
    audit = scenario.audit(settled=False)
    # in-flight jobs finished; the rest stay queued for another daemon
    scenario.expect("written_back", scenario.figures["written_back"], "==", 0)
    scenario.expect("unfinished_in_flight", audit.by_status.get("running", 0), "==", 0)
    scenario.expect_clean(audit)
    scenario.verdict()


@pytest.mark.scenario("T2b", "SIGTERM (twice) with jobs longer than the grace period")
@pytest.mark.full_campaign
@pytest.mark.timeout(60)
def test_t2b_sigterm_writes_back_long_jobs(scenario: Scenario) -> None:
    ids = scenario.enqueue(4, types=("work", "once"), ms=60_000)
    _drain(scenario, grace_s=2, twice=False)
    statuses = {
        str(r[0]): (r[1], r[2], r[3])
        for r in scenario.rows(
            "SELECT id, type, status, reason FROM jobsd.jobs WHERE id = ANY(%s)", (ids,)
        )
    }
    # R: back to queued (attempt counted: jobs.attempts keeps the interrupted run);
    # AMO: failed(shutdown), never run again
    expected = {("work", "queued", "shutdown"), ("once", "failed", "shutdown")}
    wrong = [v for v in statuses.values() if v not in expected]
    scenario.expect("wrong_write_backs", len(wrong), "==", 0)
    audit = scenario.audit(settled=False)
    scenario.expect_clean(audit)
    # a second daemon, with a second SIGTERM during its drain, loses nothing either
    scenario.enqueue(4, types=("work", "once"), ms=60_000)
    _drain(scenario, grace_s=30, twice=True, tag="second_signal_")
    audit = scenario.audit(settled=False)
    scenario.expect_clean(audit)
    scenario.verdict()


@pytest.mark.scenario("T3", "SIGSTOP a daemon for 3 x L (zombie), then SIGCONT: it exits")
@pytest.mark.full_campaign
@pytest.mark.timeout(90)
def test_t3_paused_daemon_is_fenced(scenario: Scenario) -> None:
    scenario.enqueue(8, types=("work", "once"), ms=5000)
    zombie = scenario.daemon(JOBSD_SLOTS="8")
    scenario.wait_running(8, worker_pid=zombie.pid)
    t_stop = scenario.kill(zombie, signal.SIGSTOP)
    try:
        rescuer = scenario.daemon()
        time.sleep(max(0.0, 3 * LEASE_S - (time.monotonic() - t_stop)))
    finally:
        t_cont = scenario.kill(zombie, signal.SIGCONT)
    scenario.wait_settled(timeout_s=60)
    # resumed past its lease with runs going, the zombie exits at once: nothing of it
    # may run beside the rescues
    zombie_exit = zombie.wait(10)
    breached = zombie.count(r"\bworker\.fence_breached\b")
    scenario.stop(rescuer)
    audit = scenario.audit()
    runs = scenario.runs()
    zombie_runs = [r for rs in runs.values() for r in rs if r.pid == zombie.pid]
    completed_by_zombie = scenario.count_status("succeeded", worker_pid=zombie.pid)
    scenario.record(
        zombie_window_overlaps=audit.overlaps,
        zombie_runs=len(zombie_runs),
        paused_s=round(t_cont - t_stop, 1),
    )
    # overlapping runs are the known zombie side-effect window: reported, not failed
    scenario.expect_clean(audit, overlaps_allowed=True)
    scenario.expect("zombie_exit_status", zombie_exit, "==", BREACH_EXIT_STATUS)
    scenario.expect("zombie_fence_breached", breached, "==", 1)
    scenario.expect("completions_applied_from_zombie", completed_by_zombie, "==", 0)
    scenario.verdict()


@pytest.mark.scenario("T3-rerun", "a run that follows a retry longer than L is not swept at once")
@pytest.mark.full_campaign
@pytest.mark.timeout(60)
def test_t3_a_rerun_is_not_swept_before_its_first_heartbeat(scenario: Scenario) -> None:
    # sweeps every 0.2 s: a sweep certainly runs before the new owner's first heartbeat
    daemon = scenario.daemon(JOBSD_SWEEP_INTERVAL="0.2")
    ids = scenario.enqueue(4, types=("flaky",), ms=0)
    scenario.wait_settled(timeout_s=40)
    scenario.stop(daemon)
    audit = scenario.audit()
    swept = [e for e in scenario.events() if e["reason"] == "owner unresponsive"]
    attempts = [
        r[0] for r in scenario.rows("SELECT attempts FROM jobsd.jobs WHERE id = ANY(%s)", (ids,))
    ]
    scenario.record(by_status=audit.by_status, attempts=sorted(attempts))
    scenario.expect_clean(audit)
    scenario.expect("live_runs_swept", len(swept), "==", 0)
    scenario.expect("succeeded", audit.by_status.get("succeeded", 0), "==", len(ids))
    scenario.verdict()
