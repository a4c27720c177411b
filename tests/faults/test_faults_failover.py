"""Failover (T25-T27): the primary is killed under load and its streaming standby
promoted, several times, while daemons, producers and ``jobsd api`` keep the pair's
multi-host URL (``target_session_attrs=read-write``) and are never restarted.

Synchronous replication must lose no acknowledged enqueue, run no ``at_most_once`` job
twice and no job twice at once; asynchronous replication may lose what it had not
shipped, and the scenario measures that window.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from e2e.conftest import Proc, jobsd_command, make_env, run_cli
from harness import Producer, Scenario, median
from psycopg.conninfo import make_conninfo
from support.claims import claim_params
from support.replication import ReplicatedPair

from jobsd.client import SyncClient
from jobsd.errors import NoWritableServer
from jobsd.store.named import run_named_sync

pytestmark = [pytest.mark.slow]

FAILOVERS = 5


@pytest.fixture
def pair(request: pytest.FixtureRequest) -> Iterator[ReplicatedPair]:
    """A primary and its standby (synchronous unless the test's param says ``async``)."""
    mode = getattr(request, "param", "sync")
    replicated = ReplicatedPair(synchronous=mode == "sync")
    try:
        yield replicated
    finally:
        replicated.cleanup()


def _first_end_after(scenario: Scenario, after: datetime) -> datetime | None:
    value = scenario.scalar(
        "SELECT min(at) FROM jobsd.all_job_events WHERE at > %s "
        "AND to_status IN ('succeeded', 'failed', 'cancelled') AND from_status = 'running'",
        (after,),
    )
    return value if isinstance(value, datetime) else None


def _failovers_under_load(
    scenario: Scenario, pair: ReplicatedPair, count: int
) -> tuple[list[Producer], list[float]]:
    """Run producers (short and long jobs of both deliveries) and ``count`` failovers;
    return the producers (stopped) and each promotion's time to a finished job."""
    short = Producer(
        scenario.url, 100_000, pace_s=0.01, types=("work", "once"), ms=20, deadline_s=300
    )
    long = Producer(
        scenario.url, 100_000, pace_s=0.25, types=("work", "once"), ms=1500, deadline_s=300
    )
    producers = [short, long]
    for producer in producers:
        producer.start()
    scenario.wait_running(2)
    to_first_end: list[float] = []
    for _ in range(count):
        time.sleep(1.5)  # enqueues, claims, long runs and ends in flight
        step_wall = datetime.now(UTC)
        step = pair.failover()
        promoted_wall = step_wall.timestamp() + (step.promoted_at - step.killed_at)
        deadline = time.monotonic() + 30
        first = None
        while first is None and time.monotonic() < deadline:
            first = _first_end_after(scenario, datetime.fromtimestamp(promoted_wall, UTC))
            if first is None:
                time.sleep(0.05)
        assert first is not None, "no job finished on the new primary within 30 s"
        to_first_end.append(round(first.timestamp() - promoted_wall, 3))
    time.sleep(1.0)
    for producer in producers:
        producer.stop_flag.set()
    for producer in producers:
        producer.join(60)
        assert not producer.is_alive()
        scenario.acked.update(producer.acked)
        scenario.refused.update(producer.refused)
    return producers, to_first_end


@pytest.mark.scenario("T25", "failover under load: primary killed, standby promoted, 5 times")
@pytest.mark.parametrize(
    "pair", ["sync", pytest.param("async", marks=pytest.mark.full_campaign)], indirect=True
)
@pytest.mark.timeout(240)
def test_t25_failovers_under_load(
    pair: ReplicatedPair, workdir: Path, figures: dict[str, Any]
) -> None:
    scenario = Scenario(pair.url, workdir, figures)
    try:
        daemons = [scenario.daemon(JOBSD_SLOTS="6"), scenario.daemon(JOBSD_SLOTS="6")]
        producers, to_first_end = _failovers_under_load(scenario, pair, FAILOVERS)
        scenario.wait_settled(timeout_s=90)
        alive = sum(1 for d in daemons if d.popen.poll() is None)
        exits = [scenario.stop(d) for d in daemons]
        audit = scenario.audit()
        scenario.record(
            mode="sync" if pair.synchronous else "async",
            acked=len(scenario.acked),
            refused=len(scenario.refused),
            ambiguous_resolved=sum(len(p.unknown) for p in producers),
            producer_errors=[e for p in producers for e in p.errors][:3],
            promotion_to_first_end_s=to_first_end,
            promotion_to_first_end_median_s=median(to_first_end),
            promotion_to_first_end_max_s=max(to_first_end),
            reruns_at_least_once=_reruns(scenario, "work"),
        )
        scenario.expect("failovers", len(pair.failovers), ">=", FAILOVERS)
        scenario.expect("daemons_alive_throughout", alive, "==", len(daemons))
        scenario.expect("daemon_exits", exits, "==", [0] * len(daemons))
        scenario.expect("illegal", audit.illegal, "==", 0)
        scenario.expect("stuck", audit.stuck, "==", 0)
        scenario.expect("ghost", audit.ghost, "==", 0)
        if pair.synchronous:
            scenario.expect("lost", audit.lost, "==", 0)
            scenario.expect("amo_reruns", audit.amo_reruns, "==", 0)
            scenario.expect("overlapping_runs", audit.overlaps, "==", 0)
            scenario.expect("phantom_runs", audit.phantom_runs, "==", 0)
        else:  # what was not shipped is gone: measured, not promised
            scenario.record(
                lost_acked=audit.lost,
                amo_reruns=audit.amo_reruns,
                overlapping_runs=audit.overlaps,
                phantom_runs=audit.phantom_runs,
            )
        scenario.record(lag_bytes_at_kill=[f.lag_bytes for f in pair.failovers])
        for daemon in daemons:
            scenario.expect_no_tracebacks(daemon, f"tracebacks_{daemon.pid}")
        scenario.verdict()
    finally:
        scenario.close()


def _reruns(scenario: Scenario, kind: str) -> int:
    """Count jobs of ``kind`` that ran more than once (the ledger)."""
    return sum(1 for runs in scenario.runs().values() if runs[0].type == kind and len(runs) > 1)


async def _submit_and_wait(base: str, token: str, count: int, stop_at: float) -> dict[str, Any]:
    """POST jobs with client-made ids (retrying an unanswered one with the same id) and
    long-poll each until it ends; return what was acknowledged and what each wait saw."""
    headers = {"Authorization": f"Bearer {token}"}
    acked: list[str] = []
    answers: dict[int, int] = {}
    waits: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:

        async def one(n: int) -> None:
            job_id = str(uuid.uuid4())
            while time.monotonic() < stop_at:
                try:
                    r = await client.post(
                        "/jobs",
                        json={"type": "work", "id": job_id, "payload": {"ms": 300, "n": n}},
                        headers=headers,
                    )
                except httpx.HTTPError:
                    await asyncio.sleep(0.2)
                    continue
                answers[r.status_code] = answers.get(r.status_code, 0) + 1
                if r.status_code in (200, 201, 202):
                    acked.append(job_id)
                    break
                await asyncio.sleep(0.2)  # 503: try again with the same id
            else:
                return
            while time.monotonic() < stop_at + 60:
                try:
                    r = await client.get(f"/jobs/{job_id}", params={"wait": 5}, headers=headers)
                except httpx.HTTPError:
                    await asyncio.sleep(0.2)
                    continue
                if r.status_code == 200 and r.json()["status"] in ("succeeded", "failed"):
                    waits[job_id] = r.json()["status"]
                    return
                await asyncio.sleep(0.05 if r.status_code == 200 else 0.2)

        async def paced() -> None:
            async with asyncio.TaskGroup() as tg:
                for n in range(count):
                    tg.create_task(one(n))
                    await asyncio.sleep(0.02)

        await paced()
    return {"acked": acked, "answers": answers, "waits": waits}


@pytest.mark.scenario("T26", "failover while jobsd api takes POST /jobs and long-poll waits")
@pytest.mark.timeout(180)
def test_t26_the_api_through_failovers(
    pair: ReplicatedPair, workdir: Path, figures: dict[str, Any]
) -> None:
    scenario = Scenario(pair.url, workdir, figures)
    try:
        daemon = scenario.daemon(JOBSD_SLOTS="8")
        api, base = scenario.api()
        token = scenario.token()
        count = 300
        result: dict[str, Any] = {}

        def traffic() -> None:
            result.update(asyncio.run(_submit_and_wait(base, token, count, time.monotonic() + 40)))

        import threading

        thread = threading.Thread(target=traffic, daemon=True)
        thread.start()
        scenario.wait_running(1)
        for _ in range(2):
            time.sleep(1.5)
            pair.failover()
        thread.join(120)
        assert not thread.is_alive()
        scenario.acked.update(uuid.UUID(i) for i in result["acked"])
        scenario.wait_settled(timeout_s=60)
        audit = scenario.audit()
        waited = result["waits"]
        scenario.record(answers={str(k): v for k, v in sorted(result["answers"].items())})
        scenario.expect("acknowledged", len(result["acked"]), "==", count)
        scenario.expect("lost", audit.lost, "==", 0)
        scenario.expect("waits_that_saw_the_end", len(waited), "==", len(result["acked"]))
        scenario.expect("overlapping_runs", audit.overlaps, "==", 0)
        scenario.expect("illegal", audit.illegal, "==", 0)
        scenario.expect("api_alive", api.popen.poll() is None, "==", True)
        scenario.expect("daemon_alive", daemon.popen.poll() is None, "==", True)
        scenario.expect(
            "other_5xx",
            sum(v for k, v in result["answers"].items() if k >= 500 and k != 503),
            "==",
            0,
        )
        scenario.expect_no_tracebacks(api, "api_tracebacks")
        scenario.expect_no_tracebacks(daemon)
        scenario.verdict()
    finally:
        scenario.close()


@pytest.mark.scenario("T25-claims", "a claim waits for a synchronous standby, not an async one")
@pytest.mark.parametrize("pair", ["sync", "async"], indirect=True)
@pytest.mark.timeout(60)
def test_a_claim_waits_for_a_synchronous_standby(pair: ReplicatedPair) -> None:
    """A claim may commit without waiting (a crash can undo it, and the job runs again)
    only where no standby was asked to confirm commits: on a synchronous pair a
    failover must not undo a claim whose handler runs."""
    with psycopg.connect(pair.url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobsd.jobs (org_id, type, payload) VALUES ('acme', 'work', '{}')")
        rows = run_named_sync(conn, "jobs_claim_batch", claim_params(1))
        assert len(rows) == 1
        relaxed = rows[0]["relaxed_commit"]
    assert relaxed == (0 if pair.synchronous else 1)


@pytest.mark.scenario("T25-readonly", "a URL that reaches only a standby: a clear refusal")
@pytest.mark.parametrize("pair", ["async"], indirect=True)
@pytest.mark.timeout(120)
def test_a_standby_alone_is_refused_with_a_clear_error(pair: ReplicatedPair) -> None:
    """Writes are never sent to a read-only server: a command names the cause and
    exits, the daemon refuses to start instead of retrying, and a URL that asks for any
    server gets the same words from its first write."""
    assert pair.standby is not None
    standby = pair.standby.url(pair.dbname)
    env = make_env(standby, JOBSD_ALLOW_INSECURE="1")
    t0 = time.monotonic()
    enqueue = run_cli("enqueue", "noop", "--org", "acme", env=env)
    assert enqueue.returncode != 0
    assert "no writable database server" in enqueue.stderr, enqueue.stderr
    run = run_cli("run", env={**env, "JOBSD_HANDLERS": "e2e_handlers"}, timeout_s=60)
    assert run.returncode != 0
    assert "no writable database server" in run.stderr, run.stderr[-2000:]
    assert time.monotonic() - t0 < 30
    with psycopg.connect(pair.primary.url(pair.dbname)) as conn:
        assert conn.execute("SELECT count(*) FROM jobsd.jobs").fetchone() == (0,)
    with (
        pytest.raises(NoWritableServer, match="no writable database server"),
        SyncClient(f"{standby}?target_session_attrs=any") as client,
    ):
        client.enqueue("work", {"ms": 1}, org_id="acme")


@pytest.mark.scenario("T25-hosts", "every command follows a multi-host URL to the primary")
@pytest.mark.parametrize("pair", ["async"], indirect=True)
@pytest.mark.timeout(120)
def test_commands_find_the_primary_in_a_multi_host_url(pair: ReplicatedPair) -> None:
    """The standby listed first: commands, the client and the daemon (its pools, its
    listener and its lifeline) all reach the primary."""
    assert pair.standby is not None
    url = make_conninfo(
        "",
        host="127.0.0.1,127.0.0.1",
        port=f"{pair.standby.port},{pair.primary.port}",
        dbname=pair.dbname,
        user="postgres",
    )
    env = make_env(url, JOBSD_ALLOW_INSECURE="1")
    for args in (("migrate",), ("queue", "list"), ("jobs", "list")):
        done = run_cli(*args, env=env)
        assert done.returncode == 0, (args, done.stderr[-2000:])
    enqueued = run_cli("enqueue", "noop", "--org", "acme", env=env)
    assert enqueued.returncode == 0, enqueued.stderr
    with SyncClient(url) as client:
        job = client.enqueue("noop", {}, org_id="acme")
    daemon = Proc([*jobsd_command(), "run"], {**env, "JOBSD_HANDLERS": "e2e_handlers"})
    try:
        daemon.wait_ready(timeout_s=30)
        with SyncClient(url) as client:
            assert client.wait(job.id, timeout_s=30).status == "succeeded"
        with psycopg.connect(pair.primary.url(pair.dbname), autocommit=True) as conn:
            names = {
                r[0]
                for r in conn.execute(
                    "SELECT application_name FROM pg_stat_activity "
                    "WHERE application_name LIKE 'jobsd-%'"
                )
            }
        assert {"jobsd-listen", "jobsd-lifeline", "jobsd-daemon"} <= names, names
    finally:
        daemon.send(signal.SIGTERM)
        daemon.wait(30)
