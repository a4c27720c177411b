"""``jobsd jobs retry|cancel|resolve``: every job of a filter in one command, as the
operator or as an org's token, asking first unless --yes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from support.jobs import make_job, make_jobs

from jobsd.ops import Caller
from jobsd.ops.tokens import create_token

from .conftest import make_env, run_cli
from .test_cli import assert_one_line_error

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

CLAIM = {"attempts": 1, "worker_id": "w1"}


def statuses(conn: psycopg.Connection[Any], ids: list[Any]) -> list[str]:
    rows = dict(conn.execute("SELECT id, status FROM jobsd.jobs WHERE id = ANY(%s)", (ids,)))
    return [rows[i] for i in ids]


def retried(conn: psycopg.Connection[Any], ids: list[Any]) -> set[Any]:
    rows = conn.execute("SELECT retry_of FROM jobsd.jobs WHERE retry_of = ANY(%s)", (ids,))
    return {r[0] for r in rows}


def test_jobs_retry_cancel_and_resolve_from_the_command_line(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    env = make_env(db_url)
    recent = make_jobs(conn, 3, status="failed", type="X", claim=CLAIM)
    old = make_job(
        conn,
        status="failed",
        type="X",
        claim=CLAIM,
        created_at=datetime.now(UTC) - timedelta(hours=2),
    )
    other = make_job(conn, status="failed", type="Y", claim=CLAIM)
    args = ("jobs", "retry", "--status", "failed", "--type", "X", "--since", "1h")

    # without --yes it asks; no answer (stdin closed) changes nothing
    asked = run_cli(*args, env=env)
    assert asked.returncode == 1 and "Retry 3 jobs?" in asked.stdout, asked
    assert "jobsd: error: aborted" in asked.stderr
    assert retried(conn, [*recent, old, other]) == set()

    counted = run_cli(*args, "--dry-run", "--json", env=env)
    assert counted.returncode == 0, counted.stderr
    assert json.loads(counted.stdout) == {
        "id": None,
        "action": "retry",
        "dry_run": True,
        "matched": 3,
        "done": 0,
        "requested": 0,
        "refused": {},
        "remaining": 3,
    }

    done = run_cli(*args, "--yes", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("3 matched, 3 retried, 0 still match (bulk action "), done.stdout
    assert retried(conn, [*recent, old, other]) == set(recent)
    again = run_cli(*args, "--yes", env=env)
    assert again.stdout.startswith("0 matched, 0 retried, 0 still match"), again
    asked = run_cli(*args, env=env)  # nothing to ask about
    assert asked.returncode == 0 and asked.stdout == "no job matches: nothing to retry\n", asked

    # an org's token acts on its own org's jobs only
    mine = make_job(conn, org_id="acme", type="Z")
    theirs = make_job(conn, org_id="globex", type="Z")
    token, _ = create_token(conn, Caller.as_operator("tests"), "acme", "cli")
    cancelled = run_cli("jobs", "cancel", "--type", "Z", "--yes", "--token", token, env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith("1 matched, 1 cancelled, 0 still match"), cancelled.stdout
    assert statuses(conn, [mine, theirs]) == ["cancelled", "queued"]

    stuck = make_jobs(conn, 2, status="recovery_required", claim=CLAIM)
    settled = run_cli("jobs", "resolve", "--as", "succeeded", "--yes", env=env)
    assert settled.returncode == 0, settled.stderr
    assert statuses(conn, stuck) == ["succeeded", "succeeded"]

    bad = run_cli("jobs", "cancel", "--queue", "nope", "--yes", env=env)
    assert_one_line_error(bad, "unknown queue 'nope'")
    bad = run_cli("jobs", "retry", "--limit", "10001", "--yes", env=env)
    assert_one_line_error(bad, "limit must be between 1 and 10000, not 10001")
    bad = run_cli("jobs", "resolve", "--yes", env=env)
    assert_one_line_error(bad, "say how")
