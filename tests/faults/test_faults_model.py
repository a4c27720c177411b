"""Model-based (T21): the state machine of tests/db/test_db_stateful.py (jobsd's own
statements against a pure-Python oracle: enqueue, claim, heartbeat, finish, retry,
cancel, crash, hung owners and time passing, sweep, resolve), plus one rule the fault
campaign adds: restart Postgres (fast, or immediate: crash recovery) between any two
steps. Nothing committed may change across a restart, and every invariant still holds.

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
            "SELECT count(*) AS n FROM jobsd.job_events WHERE org_id = %s", (self.org,)
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
        assert self._snapshot() == before, f"committed state changed across a {mode} restart"


@pytest.mark.scenario("T21", "model-based histories with Postgres restarts and crash recovery")
@pytest.mark.full_campaign
@pytest.mark.timeout(900)
def test_t21_random_histories_survive_restarts(
    fault_cluster: EmbeddedPostgres, fault_db: str, figures: dict[str, Any]
) -> None:
    RestartingMachine.cluster = fault_cluster
    RestartingMachine.restarts = 0
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
        examples=examples, max_steps=steps, restarts=RestartingMachine.restarts, failures=0
    )
