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

# what the user reads for each job, after its daemon died at either point
HISTORY = {
    "demo_publish": [  # at_least_once: rescued, run again
        "- -> queued (attempt 0)",
        "queued -> running (attempt 1)",
        "running -> queued (attempt 1, owner died)",
        "queued -> running (attempt 2)",
        "running -> succeeded (attempt 2)",
    ],
    "demo_publish_once": [  # at_most_once: never run again, the recover hook decides
        "- -> queued (attempt 0)",
        "queued -> running (attempt 1)",
        "running -> recovery_required (attempt 1, worker lost)",
        "recovery_required -> succeeded (attempt 1, recovered_after_publish)",
    ],
}


def _shown(stdout: str) -> dict[str, list[str]]:
    """Split the demo's output into one block of lines per job, keyed by job id."""
    blocks: dict[str, list[str]] = {}
    for block in stdout.split("\n== ")[1:]:
        head, *lines = block.strip().splitlines()
        blocks[head.rsplit("job ", 1)[1]] = ["== " + head, *lines]
    return blocks


@pytest.mark.heavy
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

    shown = _shown(result.stdout.split("\n4 of 4 jobs")[0])
    assert sorted(shown) == sorted(str(r[0]) for r in rows), result.stdout
    for job_id, kind, _, reason, _, report, point in rows:
        history = HISTORY[kind]
        events = conn.execute(
            "SELECT coalesce(from_status, '-'), to_status, attempt, reason"
            " FROM jobsd.all_job_events WHERE job_id = %s ORDER BY id",
            (job_id,),
        ).fetchall()
        assert [
            f"{a} -> {b} (attempt {n}" + (f", {why}" if why else "") + ")"
            for a, b, n, why in events
        ] == history, "the demo shows the recorded history"
        assert shown[str(job_id)] == [
            f"== {kind} dies at {point}: job {job_id}",
            f"   daemon 1 (JOBSD_FAULT={point}) exited with code 70",
            "   daemon 2 recovered it: succeeded" + (f" ({reason})" if reason else ""),
            f"   report: {json.dumps(report)}",
            "   history:",
            *(f"     {line}" for line in history),
            "   published: 1 artifact, publish called "
            f"{1 if kind == 'demo_publish_once' else 2} time(s)",
        ], result.stdout
    assert_history_complete(conn)


def test_a_fault_point_is_refused_without_allow_faults(db_url: str) -> None:
    result = run_cli("run", env=make_env(db_url, JOBSD_FAULT="after_publish"))
    assert result.returncode != 0
    assert "JOBSD_ALLOW_FAULTS=1" in result.stderr
    assert "Traceback" not in result.stderr
