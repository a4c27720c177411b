"""Random sequences of everything that can happen to jobs, run against a real Postgres
with jobsd's own statements (claim, reserve ahead and start, give back, lost answers
and their reconciliation, heartbeat, finish, retry, cancel, crash, sweep, recovery and
resolve, time passing); after every step the invariants of docs/semantics.md must
hold: among them, attempts count handler starts, and a worker has no more jobs running
than its slots."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg.rows import dict_row
from support.claims import claim_params
from support.history import history_problems

from jobsd.jsonsafe import ERROR_RECORDS_KEPT
from jobsd.models import TERMINAL_STATES, JobStatus
from jobsd.store import queries
from jobsd.store.queries import run_named_sync
from jobsd.worker.decide import rescuer, rules_from

# amr: at_most_once with a recover hook
TYPES = {"alo": "at_least_once", "amo": "at_most_once", "amr": "recover"}
MAX_ATTEMPTS = 2
# the sweeper's decisions for those types (the statements only apply them)
RESCUE = rescuer(rules_from(max_attempts=dict.fromkeys(TYPES, MAX_ATTEMPTS), deliveries=TYPES))
WORKERS = ("w1", "w2")
SLOTS = 2


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
        # reserved ahead of the slots (queued), by worker: (id, reservation lease)
        self.reserved: dict[str, list[tuple[uuid.UUID, uuid.UUID]]] = {w: [] for w in WORKERS}
        # a start whose answer was lost: (id, reservation lease, new lease), to confirm
        self.in_doubt: dict[str, list[tuple[uuid.UUID, uuid.UUID, uuid.UUID]]] = {
            w: [] for w in WORKERS
        }
        # the runs of a claim whose answer was lost: adopted before the next claim
        self.lost_runs: dict[str, list[tuple[uuid.UUID, uuid.UUID]] | None] = {
            w: None for w in WORKERS
        }
        # handler starts, as the workers saw them: what attempts must count
        self.starts: Counter[uuid.UUID] = Counter()
        # runs counted in the database that no worker was seen to start: a start in
        # doubt or a lost claim of a worker that died before it knew
        self.unseen: Counter[uuid.UUID] = Counter()
        self.dead: set[str] = set()
        # leases taken from live (hung) owners by a sweep: they may still try to write
        self.stale: list[tuple[uuid.UUID, uuid.UUID]] = []

    def teardown(self) -> None:
        self.conn.close()

    def _run(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return run_named_sync(self.conn, name, params)

    # --- rules -------------------------------------------------------------------

    @rule(kind=st.sampled_from(sorted(TYPES)), later=st.booleans(), n=st.integers(1, 4))
    def enqueue(self, kind: str, later: bool, n: int) -> None:
        for _ in range(n):
            self._enqueue_one(kind, later)

    def _enqueue_one(self, kind: str, later: bool) -> None:
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

    def _free(self, worker: str) -> int:
        # the slots of a lost claim's runs stay taken until they are adopted
        lost = len(self.lost_runs[worker] or [])
        return SLOTS - len(self.held[worker]) - len(self.in_doubt[worker]) - lost

    def _hold(self, worker: str, started: list[tuple[uuid.UUID, uuid.UUID]]) -> None:
        """A worker's handlers start for these runs: each one a start of its job."""
        self.held[worker].extend(started)
        self.starts.update(job_id for job_id, _ in started)

    @rule(worker=st.sampled_from(WORKERS), ahead=st.integers(0, 2), lost=st.booleans())
    def claim(self, worker: str, ahead: int, lost: bool) -> None:
        """Claim into the free slots, and reserve ``ahead`` more; or lose the answer."""
        if worker in self.dead:
            return
        self.adopt(worker)
        free = self._free(worker)
        if free + ahead <= 0:
            return
        rows = self._run(
            "jobs_claim_batch", claim_params(free + ahead, worker, free=free, reserve_s=3600.0)
        )
        mine = [r for r in rows if r["org_id"] == self.org]
        assert len(mine) == len(rows), "a job of an earlier example"
        assert sum(r["status"] == "running" for r in rows) <= free
        if lost:
            # committed, answer lost: the running ones are adopted before the next
            # claim, the reserved ones lapse
            self.lost_runs[worker] = [
                (r["id"], r["lease_id"]) for r in rows if r["status"] == "running"
            ]
            return
        self._hold(worker, [(r["id"], r["lease_id"]) for r in rows if r["status"] == "running"])
        self.reserved[worker].extend(
            (r["id"], r["lease_id"]) for r in rows if r["status"] == "queued"
        )

    def adopt(self, worker: str) -> None:
        """After a claim whose answer was lost: run its jobs (jobs_owned_unheld)."""
        lost = self.lost_runs[worker]
        if lost is None:
            return
        self.lost_runs[worker] = None
        held = [lease for _, lease in self.held[worker]]
        held += [new for _, _, new in self.in_doubt[worker]]
        rows = self._run("jobs_owned_unheld", {"worker_id": worker, "held": held})
        found = [(r["id"], r["lease_id"]) for r in rows]
        assert set(found) == set(lost), (found, lost)
        self._hold(worker, found)

    @precondition(lambda self: any(self.reserved.values()))
    @rule(worker=st.sampled_from(WORKERS), lost=st.booleans())
    def start(self, worker: str, lost: bool) -> None:
        """Start reserved jobs in the free slots; or lose the start's answer."""
        if worker in self.dead:
            return
        free = self._free(worker)
        taken = self.reserved[worker][: max(free, 0)]
        if not taken:
            return
        del self.reserved[worker][: len(taken)]
        runs = [(job_id, lease, uuid.uuid4()) for job_id, lease in taken]
        rows = self._run("jobs_start_reserved", _start_params(runs, confirm=False))
        if lost:
            self.in_doubt[worker].extend(runs)
            return
        started = {r["id"] for r in rows}
        self._hold(worker, [(job_id, new) for job_id, _, new in runs if job_id in started])

    @precondition(lambda self: any(self.in_doubt.values()))
    @rule(worker=st.sampled_from(WORKERS))
    def confirm(self, worker: str) -> None:
        """Try a start whose answer was lost again, with confirm."""
        runs = self.in_doubt[worker]
        if worker in self.dead or not runs:
            return
        rows = self._run("jobs_start_reserved", _start_params(runs, confirm=True))
        started = {r["id"] for r in rows}
        self.in_doubt[worker] = []
        self._hold(worker, [(job_id, new) for job_id, _, new in runs if job_id in started])

    @precondition(lambda self: any(self.reserved.values()))
    @rule(worker=st.sampled_from(WORKERS))
    def give_back(self, worker: str) -> None:
        """Release the worker's reservations (a stop, or no slot freed in time)."""
        taken, self.reserved[worker] = self.reserved[worker], []
        if worker in self.dead or not taken:
            return
        self._run(
            "jobs_release_reserved",
            {"ids": [j for j, _ in taken], "lease_ids": [lease for _, lease in taken]},
        )

    @rule()
    def reservations_lapse(self) -> None:
        """Time passes beyond every reservation: any worker may claim those jobs."""
        self.conn.execute(
            "UPDATE jobsd.jobs SET reserved_until = now() - interval '1 second' "
            "WHERE org_id = %s AND reserved_until IS NOT NULL",
            (self.org,),
        )

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
        written = self._run("jobs_finish_batch", _finish_params(results))
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
                assert self._run("jobs_finish_batch", _finish_params([cancelled]))
                continue
            kept.append((job_id, lease_id))
        self.held[worker] = kept

    @rule(pick=st.integers(0, 50))
    def cancel(self, pick: int) -> None:
        if not self.jobs:
            return
        # by enqueue order, not by id: ids are random, and a replay must pick the same
        job_id = list(self.jobs)[pick % len(self.jobs)]
        with self.conn.transaction():
            self._run("admin_set_actor", {"worker_id": "test"})
            self._run("jobs_cancel", {"id": job_id, "org_id": self.org, "reason": "test"})

    @rule(worker=st.sampled_from(WORKERS))
    def crash(self, worker: str) -> None:
        """kill -9: the worker's leases stay in the database, its session lock is gone."""
        self.dead.add(worker)
        # a dead process writes nothing more; its reservations lapse, and a start it had
        # in doubt may have committed (the sweep sees it running under its dead owner)
        self.held[worker] = []
        self.reserved[worker] = []
        self.unseen.update(job_id for job_id, _, _ in self.in_doubt[worker])
        self.in_doubt[worker] = []
        self.unseen.update(job_id for job_id, _ in self.lost_runs[worker] or [])
        self.lost_runs[worker] = None

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
            candidates = self._run(
                "jobs_rescue_candidates",
                queries.rescue_params(
                    now=now,
                    stale_after_s=600.0 if hours else None,
                    dead_workers=sorted(self.dead),
                ),
            )
            rows = self._run("jobs_rescue_apply", queries.rescue_apply_params(candidates, RESCUE))
        rescued = {r["id"] for r in rows}
        for worker in WORKERS:
            # a run in doubt (a start or a claim whose answer was lost) that the sweep
            # took was counted, and no worker saw it start
            doubt = self.in_doubt[worker]
            self.unseen.update(j for j, _, _ in doubt if j in rescued)
            self.in_doubt[worker] = [run for run in doubt if run[0] not in rescued]
            lost = self.lost_runs[worker]
            if lost is not None:
                self.unseen.update(j for j, _ in lost if j in rescued)
                self.lost_runs[worker] = [run for run in lost if run[0] not in rescued]
            # a live worker whose job was taken keeps a lease it no longer owns
            self.stale.extend(x for x in self.held[worker] if x[0] in rescued)
            self.held[worker] = [x for x in self.held[worker] if x[0] not in rescued]

    @rule(pick=st.integers(0, 50), status=st.sampled_from(["succeeded", "failed", "queued"]))
    def resolve(self, pick: int, status: str) -> None:
        """A recover hook's answer or an operator's: settle a recovery_required job."""
        recovering = {
            r["id"]
            for r in self.conn.execute(
                "SELECT id FROM jobsd.jobs WHERE org_id = %s AND status = 'recovery_required'",
                (self.org,),
            ).fetchall()
        }
        waiting = [job_id for job_id in self.jobs if job_id in recovering]  # enqueue order
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
                    "org_id": None,
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
            "SELECT job_id, from_status, to_status, attempt, reason FROM jobsd.all_job_events "
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
        # an attempt is a handler start: a job's attempts are the runs the workers
        # started (a start in doubt or a lost claim may have counted one not started
        # yet: until it is confirmed or adopted, or its worker dies)
        doubtful = Counter(j for runs in self.in_doubt.values() for j, _, _ in runs)
        doubtful.update(j for runs in self.lost_runs.values() for j, _ in runs or [])
        for job in jobs:
            seen, maybe = self.starts[job["id"]], doubtful[job["id"]] + self.unseen[job["id"]]
            assert seen <= job["attempts"] <= seen + maybe, (job, seen, maybe)
        # a live worker runs no more jobs than its slots
        for worker in WORKERS:
            if worker not in self.dead:
                assert len(self._running_of(worker)) <= SLOTS, worker
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


def _finish_params(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The parameters of jobs_finish_batch, as store.queries.finish_batch passes them."""
    return {"results": json.dumps(results), "confirm": False, "errors_kept": ERROR_RECORDS_KEPT}


def _start_params(
    runs: list[tuple[uuid.UUID, uuid.UUID, uuid.UUID]], *, confirm: bool
) -> dict[str, Any]:
    return {
        "ids": [r[0] for r in runs],
        "lease_ids": [r[1] for r in runs],
        "new_lease_ids": [r[2] for r in runs],
        "relaxed": True,
        "confirm": confirm,
    }


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
