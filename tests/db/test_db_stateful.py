"""Random sequences of everything that can happen to jobs, run against a real Postgres
with jobsd's own statements (claim, heartbeat, finish, retry, cancel, crash, sweep,
recovery and resolve, time passing); after every step the invariants of
docs/semantics.md must hold."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from psycopg.rows import dict_row
from support.claims import claim_params
from support.history import history_problems

from jobsd.models import TERMINAL_STATES, JobStatus
from jobsd.store.queries import run_named_sync

# amr: at_most_once with a recover hook (the sweep passes its delivery as 'recover')
TYPES = {"alo": "at_least_once", "amo": "at_most_once", "amr": "recover"}
MAX_ATTEMPTS = 2
WORKERS = ("w1", "w2")


class JobsMachine(RuleBasedStateMachine):
    """One org's jobs, two workers that can crash, a sweeper, a clock that can jump."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.conn = psycopg.connect(url, autocommit=True, row_factory=dict_row)
        # examples share the test's database: each starts from an empty table
        self.conn.execute("DELETE FROM jobsd.jobs")
        self.org = f"org-{uuid.uuid4().hex[:12]}"
        self.jobs: dict[uuid.UUID, str] = {}  # id -> type
        self.terminal: dict[uuid.UUID, str] = {}  # first terminal status seen
        self.held: dict[str, list[tuple[uuid.UUID, uuid.UUID]]] = {w: [] for w in WORKERS}
        self.dead: set[str] = set()
        # leases taken from live (hung) owners by a sweep: they may still try to write
        self.stale: list[tuple[uuid.UUID, uuid.UUID]] = []

    def teardown(self) -> None:
        self.conn.close()

    def _run(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return run_named_sync(self.conn, name, params)

    # --- rules -------------------------------------------------------------------

    @rule(kind=st.sampled_from(sorted(TYPES)), later=st.booleans())
    def enqueue(self, kind: str, later: bool) -> None:
        run_after = datetime.now(UTC) + timedelta(hours=1) if later else None
        rows = self._run(
            "jobs_insert",
            {
                "id": uuid.uuid4(),
                "org_id": self.org,
                "type": kind,
                "queue": "default",
                "dedup_key": None,
                "payload": "{}",
                "run_after": run_after,
                "priority": 0,
                "concurrency_key": None,
                "trace_context": None,
                "blocked": False,
            },
        )
        self.jobs[rows[0]["id"]] = kind

    @rule(worker=st.sampled_from(WORKERS))
    def claim(self, worker: str) -> None:
        if worker in self.dead:
            return
        rows = self._run(
            "jobs_claim_batch",
            claim_params(1, worker),
        )
        mine = [r for r in rows if r["org_id"] == self.org]
        assert len(mine) == len(rows), "a job of an earlier example"
        self.held[worker].extend((r["id"], r["lease_id"]) for r in mine)

    @rule(
        worker=st.sampled_from(WORKERS),
        pick=st.integers(0, 5),
        outcome=st.sampled_from(["succeeded", "failed", "retry"]),
        stale=st.booleans(),
    )
    def finish(self, worker: str, pick: int, outcome: str, stale: bool) -> None:
        """Write an outcome: a live worker's, or (stale) the late one of a hung owner."""
        pool = self.stale if stale else self.held[worker]
        if not pool:
            return
        job_id, lease_id = pool.pop(pick % len(pool))
        status, delay = outcome, None
        if outcome == "retry":
            attempts = self._job(job_id)["attempts"]
            # an explicit retry policy, as the executor applies it
            if self.jobs[job_id] != "alo" or attempts >= MAX_ATTEMPTS:
                status = "failed"
            else:
                status, delay = "scheduled", 0.0
        results = [
            {
                "id": str(job_id),
                "lease_id": str(lease_id),
                "status": status,
                "report": None,
                "error": None,
                "reason": "retry" if status == "scheduled" else None,
                "progress": None,
                "run_after": None,
                "delay_s": delay,
            }
        ]
        written = self._run("jobs_finish_batch", {"results": json.dumps(results)})
        if stale:
            assert not written, "a stale owner's result was applied"

    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat(self, worker: str) -> None:
        held = self.held[worker]
        if not held:
            return
        rows = self._run(
            "jobs_heartbeat",
            {
                "ids": [j for j, _ in held],
                "lease_ids": [lease for _, lease in held],
                "fields": [None for _ in held],
            },
        )
        alive = {r["id"]: r["cancel_requested"] for r in rows}
        kept = []
        for job_id, lease_id in held:
            if job_id not in alive:
                continue  # lease lost: the handler is cancelled, its result discarded
            if alive[job_id]:
                cancelled = {
                    "id": str(job_id),
                    "lease_id": str(lease_id),
                    "status": "cancelled",
                    "reason": "cancel requested",
                }
                assert self._run("jobs_finish_batch", {"results": json.dumps([cancelled])})
                continue
            kept.append((job_id, lease_id))
        self.held[worker] = kept

    @rule(pick=st.integers(0, 50))
    def cancel(self, pick: int) -> None:
        if not self.jobs:
            return
        job_id = sorted(self.jobs)[pick % len(self.jobs)]
        with self.conn.transaction():
            self._run("admin_set_actor", {"worker_id": "test"})
            self._run("jobs_cancel", {"id": job_id, "org_id": self.org, "reason": "test"})

    @rule(worker=st.sampled_from(WORKERS))
    def crash(self, worker: str) -> None:
        """kill -9: the worker's leases stay in the database, its session lock is gone."""
        self.dead.add(worker)
        self.held[worker] = []  # a dead process writes nothing more

    @rule(worker=st.sampled_from(WORKERS))
    def restart(self, worker: str) -> None:
        if worker in self.dead and not any(self._running_of(worker)):
            self.dead.discard(worker)

    @rule(hours=st.sampled_from([0, 1]))
    def sweep(self, hours: int) -> None:
        """Rescue dead owners' jobs; with time passed, hung owners' jobs too."""
        now = datetime.now(UTC) + timedelta(hours=hours)
        with self.conn.transaction():
            self._run("admin_set_actor", {"worker_id": "sweeper"})
            rows = self._run(
                "jobs_sweep_stale",
                {
                    "now": now,
                    "stale_after_s": 600.0 if hours else None,
                    "types": list(TYPES),
                    "max_attempts": [MAX_ATTEMPTS] * len(TYPES),
                    "deliveries": list(TYPES.values()),
                    "default_max_attempts": 1,
                    "dead_workers": sorted(self.dead),
                    "only": None,
                },
            )
        rescued = {r["id"] for r in rows}
        for worker in WORKERS:
            # a live worker whose job was taken keeps a lease it no longer owns
            self.stale.extend(x for x in self.held[worker] if x[0] in rescued)
            self.held[worker] = [x for x in self.held[worker] if x[0] not in rescued]

    @rule(pick=st.integers(0, 50), status=st.sampled_from(["succeeded", "failed", "queued"]))
    def resolve(self, pick: int, status: str) -> None:
        """A recover hook's answer or an operator's: settle a recovery_required job."""
        waiting = sorted(
            r["id"]
            for r in self.conn.execute(
                "SELECT id FROM jobsd.jobs WHERE org_id = %s AND status = 'recovery_required'",
                (self.org,),
            ).fetchall()
        )
        if not waiting:
            return
        job_id = waiting[pick % len(waiting)]
        with self.conn.transaction():
            self._run("admin_set_actor", {"worker_id": "ops"})
            rows = self._run(
                "jobs_resolve",
                {
                    "id": job_id,
                    "status": status,
                    "reason": "resolved by operator",
                    "report": None,
                    "error": None,
                },
            )
        assert rows and rows[0]["status"] == status

    @rule()
    def time_passes(self) -> None:
        self._run("jobs_promote_due", {"limit": 100, "now": datetime.now(UTC) + timedelta(hours=2)})

    # --- invariants ----------------------------------------------------------------

    def _job(self, job_id: uuid.UUID) -> dict[str, Any]:
        rows = self._run("jobs_get", {"id": job_id})
        assert rows, f"job {job_id} lost"
        return rows[0]

    def _running_of(self, worker: str) -> list[dict[str, Any]]:
        cur = self.conn.execute(
            "SELECT id FROM jobsd.jobs WHERE org_id = %s AND status = 'running' AND worker_id = %s",
            (self.org, worker),
        )
        return cur.fetchall()

    @invariant()
    def invariants_hold(self) -> None:
        jobs = self.conn.execute(
            "SELECT id, status, attempts, type FROM jobsd.jobs WHERE org_id = %s", (self.org,)
        ).fetchall()
        events = self.conn.execute(
            "SELECT job_id, from_status, to_status, attempt, reason FROM jobsd.job_events "
            "WHERE org_id = %s ORDER BY job_id, id",
            (self.org,),
        ).fetchall()
        # no job lost, every one in a known state
        assert {j["id"] for j in jobs} == set(self.jobs)
        assert all(j["status"] in set(JobStatus) for j in jobs)
        # terminal states never change
        for job in jobs:
            if job["id"] in self.terminal:
                assert job["status"] == self.terminal[job["id"]], job
            elif JobStatus(job["status"]) in TERMINAL_STATES:
                self.terminal[job["id"]] = job["status"]
        # the history is gapless, made of edges, and matches the jobs
        assert history_problems(jobs, events) == []
        runs = Counter(
            e["job_id"] for e in events if e["to_status"] == "running" != e["from_status"]
        )
        # an operator's requeue is an explicit decision to run again
        requeued = Counter(
            e["job_id"]
            for e in events
            if e["from_status"] == "recovery_required" and e["to_status"] == "queued"
        )
        for job in jobs:
            if job["type"] == "amr":
                assert runs[job["id"]] <= 1 + requeued[job["id"]], f"{job['id']} ran again"
            elif job["type"] == "amo":
                assert runs[job["id"]] <= 1, f"at_most_once job {job['id']} ran twice"
            else:
                assert runs[job["id"]] <= MAX_ATTEMPTS, f"job {job['id']} ran too often"


def test_random_histories_keep_every_invariant(db_url: str) -> None:
    run_state_machine_as_test(
        lambda: JobsMachine(db_url),
        settings=settings(
            max_examples=150,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
