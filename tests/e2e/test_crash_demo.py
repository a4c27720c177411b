"""Seed 001's crash demo (issue 11): `jobsd demo crash` kills a daemon at each fault point,
for an at_least_once and an at_most_once type; each job ends with one business effect."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.history import assert_history_complete

from .conftest import make_env, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_jobsd_demo_crash_recovers_every_job_with_its_side_effect_once(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    result = run_cli(
        "demo", "crash", "--workspace", str(workspace), env=make_env(db_url), timeout_s=220
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 of 4 jobs recovered with their side effect once" in result.stdout
    assert result.stdout.count("exited with code 70") == 4, "each daemon died at its point"
    rows = conn.execute(
        "SELECT id, type, status, reason, attempts, report, payload ->> 'point' "
        "FROM jobsd.jobs ORDER BY created_at"
    ).fetchall()
    calls = (workspace / "publish.log").read_text().splitlines()
    assert [(r[6], r[1]) for r in rows] == [
        ("after_publish", "demo_publish"),
        ("after_publish", "demo_publish_once"),
        ("after_outcome_sent", "demo_publish"),
        ("after_outcome_sent", "demo_publish_once"),
    ]
    for job_id, kind, status, reason, attempts, report, _ in rows:
        artifact = workspace / "published" / f"{job_id}.json"
        assert json.loads(artifact.read_text())["job_id"] == str(job_id), "published once"
        assert status == "succeeded", (kind, reason)
        runs = sum(1 for line in calls if line.startswith(str(job_id)))
        if kind == "demo_publish":  # at_least_once: ran again, the publication is idempotent
            assert (attempts, runs, reason) == (2, 2, None)
        else:  # at_most_once: never ran again, its recover hook found the publication
            assert (attempts, runs, reason) == (1, 1, "recovered_after_publish")
            assert report["found_by"] == "recover"
    assert len(list((workspace / "published").iterdir())) == 4
    assert_history_complete(conn)


def test_a_fault_point_is_refused_without_allow_faults(db_url: str) -> None:
    result = run_cli("run", env=make_env(db_url, JOBSD_FAULT="after_publish"))
    assert result.returncode != 0
    assert "JOBSD_ALLOW_FAULTS=1" in result.stderr
    assert "Traceback" not in result.stderr
