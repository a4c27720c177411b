"""Model-based (T21): the state machine of tests/db/test_db_stateful.py (jobsd's own
statements against a pure-Python oracle: enqueue, claim, heartbeat, finish, retry,
cancel, crash, hung owners and time passing, sweep, resolve), plus one rule the fault
campaign adds: restart Postgres (fast, or immediate: crash recovery) between any two
steps. Nothing committed may change across a restart, and every invariant still holds;
the one exception is the claim, which commits without waiting for the disk: a crash
right after one may undo it, whole (the job queued as before it, no running event),
and the worker's lease is then stale, its writes fenced.

The machine itself runs in the default suite (tests/db); this variant, with restarts,
runs with the full campaign.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import psycopg
import pytest
from harness import sized
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test
from psycopg.rows import dict_row

from jobsd.dev.embedded import EmbeddedPostgres

pytestmark = [pytest.mark.slow]

_BASE = Path(__file__).resolve().parents[1] / "db" / "test_db_stateful.py"
_spec = importlib.util.spec_from_file_location("faults_stateful_base", _BASE)
assert _spec is not None and _spec.loader is not None
stateful = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stateful)


class RestartingMachine(stateful.JobsMachine):  # type: ignore[misc, name-defined]
    """The jobs machine, with Postgres restarted (or crashed and recovered) at random."""

    cluster: EmbeddedPostgres
    restarts = 0
    undone_claims = 0

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url

    def _snapshot(self) -> list[dict[str, Any]]:
        jobs = self.conn.execute(
            "SELECT id, status, attempts, lease_id, reason FROM jobsd.jobs WHERE org_id = %s "
            "ORDER BY id",
            (self.org,),
        ).fetchall()
        events = self.conn.execute(
            "SELECT count(*) AS n FROM jobsd.all_job_events WHERE org_id = %s", (self.org,)
        ).fetchall()
        return [*jobs, *events]

    @rule(mode=st.sampled_from(["fast", "immediate"]))
    def restart_db(self, mode: str) -> None:
        before = self._snapshot()
        self.conn.close()
        self.cluster.stop(mode)
        self.cluster.start()
        self.conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
        type(self).restarts += 1
        after = self._snapshot()
        if after == before:
            return
        # A claim commits without waiting for the disk (docs/decisions.md): a crash
        # right after one may undo it, whole. Nothing else may change.
        assert mode == "immediate", f"committed state changed across a {mode} restart"
        undone = _undone_claims(before, after)
        for worker, held in self.held.items():
            self.stale.extend(h for h in held if h[0] in undone)  # its writes are fenced
            self.held[worker] = [h for h in held if h[0] not in undone]
        # the undone start's attempt is not counted (docs/states.md): the run it began
        # is fenced, its start no longer one the job's attempts count
        for job_id in undone:
            if self.starts[job_id] > 0:
                self.starts[job_id] -= 1
            else:  # a start no worker was seen to make
                self.unseen[job_id] -= 1
        type(self).undone_claims += len(undone)


def _undone_claims(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> set[Any]:
    """Return the ids of the jobs whose claim a crash undid; fail on any other change.

    An undone claim leaves the job as it was before it: ``queued``, its attempt not
    counted, no lease (or, for the start of a reserved job, the reservation's lease),
    and no ``running`` event (one event fewer per job).
    """
    *jobs_before, events_before = before
    *jobs_after, events_after = after
    assert [j["id"] for j in jobs_before] == [j["id"] for j in jobs_after], "jobs came or went"
    undone = set()
    for was, now in zip(jobs_before, jobs_after, strict=True):
        if was == now:
            continue
        assert was["status"] == "running" and was["lease_id"] is not None, (was, now)
        assert now["status"] == "queued" and now["lease_id"] != was["lease_id"], (was, now)
        assert now["attempts"] == was["attempts"] - 1, (was, now)
        undone.add(was["id"])
    assert events_before["n"] - events_after["n"] == len(undone), "an event without its claim"
    return undone


@pytest.mark.scenario("T21", "model-based histories with Postgres restarts and crash recovery")
@pytest.mark.full_campaign
@pytest.mark.timeout(900)
def test_t21_random_histories_survive_restarts(
    fault_cluster: EmbeddedPostgres, fault_db: str, figures: dict[str, Any]
) -> None:
    RestartingMachine.cluster = fault_cluster
    RestartingMachine.restarts = 0
    RestartingMachine.undone_claims = 0
    examples, steps = sized(quick=10, full=60), 30
    run_state_machine_as_test(
        lambda: RestartingMachine(fault_db),
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
    figures.update(
        examples=examples,
        max_steps=steps,
        restarts=RestartingMachine.restarts,
        claims_undone_by_a_crash=RestartingMachine.undone_claims,
        failures=0,
    )


def test_t21_an_undone_claim_is_told_from_any_other_change() -> None:
    """The restart rule's exception, on its own: an undone claim is accepted (and named),
    anything else a restart changed is not."""
    running = {"id": 1, "status": "running", "attempts": 1, "lease_id": "L", "reason": None}
    queued = {"id": 1, "status": "queued", "attempts": 0, "lease_id": None, "reason": None}
    other = {"id": 2, "status": "succeeded", "attempts": 1, "lease_id": None, "reason": None}
    assert _undone_claims([running, other, {"n": 4}], [queued, other, {"n": 3}]) == {1}
    # the start of a reserved job: queued again under its reservation's lease
    reserved = {**queued, "lease_id": "R"}
    assert _undone_claims([running, {"n": 4}], [reserved, {"n": 3}]) == {1}
    refused = [
        ([running, {"n": 4}], [queued, {"n": 4}]),  # the running event stayed
        ([running, {"n": 4}], [{**queued, "attempts": 1}, {"n": 3}]),  # attempt still counted
        ([other, {"n": 4}], [{**other, "status": "failed"}, {"n": 4}]),  # not a claim
        ([running, {"n": 4}], [{"n": 3}]),  # the job went
    ]
    for before, after in refused:
        with pytest.raises(AssertionError):
            _undone_claims(before, after)
