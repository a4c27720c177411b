"""``jobsd prune`` on the command line: its summary, JSON, and one-line errors."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from support.retention import event_counts, job_ids, set_retention, v7_at
from support.retention import make_old_job as make_job

from .conftest import make_env, run_cli

pytestmark = pytest.mark.timeout(90)


def assert_one_line_error(result: Any, *fragments: str) -> str:
    """Check an error exit: non-zero, one ``jobsd: error:`` line, no traceback, no stdout."""
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    # JOBSD_ALLOW_INSECURE's warning (the test server is plain TCP) is not the error
    lines = [
        line
        for line in result.stderr.strip().splitlines()
        if not line.startswith("jobsd: warning: TCP host")
    ]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    assert lines[0].startswith("jobsd: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.stdout == "", "nothing on stdout when nothing was done"
    return lines[0]


def test_prune_summarises_dry_run_then_deletes_only_due_jobs(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    now = datetime.now(UTC)
    set_retention(conn, "default", 30)
    set_retention(conn, "keep", None)
    due = {make_job(conn, now, days=40), make_job(conn, now, status="cancelled", days=31)}
    due.add(make_job(conn, now, type="report", days=10))  # --type-retention report=7
    kept = {
        make_job(conn, now, days=20),
        make_job(conn, now, status="queued", days=400),
        make_job(conn, now, status="failed", queue="keep", days=400),
        make_job(conn, now, type="audit", days=400),  # --spare-type audit
    }
    events = event_counts(conn)
    env = make_env(db_url)
    policy = ["--type-retention", "report=7", "--spare-type", "audit"]

    dry = run_cli("prune", "--dry-run", *policy, env=env)

    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[:3] == [
        "queue    retention  would delete",
        "default  30 days    3",
        "keep     forever    0",
    ], dry.stdout
    assert lines[3:5] == ["type retention: report 7 days", "spared types: audit"]
    assert lines[5].startswith("would delete 3 jobs (dry run: nothing deleted; ")
    assert (job_ids(conn), event_counts(conn)) == (due | kept, events)

    real = run_cli("prune", "--json", "--batch-size", "2", *policy, env=env)

    assert real.returncode == 0, real.stderr
    report = json.loads(real.stdout)
    assert report["dry_run"] is False
    assert report["deleted"] == {"default": 3, "keep": 0}
    assert report["total"] == 3
    assert report["queue_retention_days"] == {"default": 30, "keep": None}
    assert report["type_retention_days"] == {"report": 7}
    assert report["spare_types"] == ["audit"]
    assert job_ids(conn) == kept
    assert set(event_counts(conn)) == kept, "the history of a pruned job goes with it"

    again = run_cli("prune", *policy, env=env)

    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1].startswith("deleted 0 jobs (")
    assert job_ids(conn) == kept


def test_full_scan_finds_a_job_whose_id_is_younger_than_it(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    now = datetime.now(UTC)
    set_retention(conn, "default", 30)
    imported = make_job(conn, now, days=40, job_id=v7_at(now - timedelta(days=1)))
    env = make_env(db_url)

    plain = run_cli("prune", "--json", env=env)

    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["total"] == 0
    assert job_ids(conn) == {imported}

    full = run_cli("prune", "--json", "--full-scan", env=env)

    assert full.returncode == 0, full.stderr
    assert json.loads(full.stdout)["deleted"] == {"default": 1}
    assert job_ids(conn) == set()


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--type-retention", "report=-1"], ["'report=-1'", "DAYS must be a whole number >= 0"]),
        (["--type-retention", "report=1.5"], ["'report=1.5'", "whole number >= 0"]),
        (["--type-retention", "report"], ["use TYPE=DAYS"]),
        (["--type-retention", "=7"], ["use TYPE=DAYS"]),
        (["--type-retention", "a=1", "--type-retention", "a=2"], ["given twice"]),
        (["--spare-type", " "], ["--spare-type needs a type name"]),
        (["--batch-size", "0"], ["--batch-size '0'"]),
        (["--batch-size", "lots"], ["--batch-size 'lots'"]),
    ],
    ids=["negative", "fraction", "no-days", "no-type", "twice", "empty-spare", "zero", "nan"],
)
def test_bad_input_is_one_line_and_deletes_nothing(
    db_url: str, conn: psycopg.Connection[Any], args: list[str], fragments: list[str]
) -> None:
    set_retention(conn, "default", 1)
    jobs = {make_job(conn, datetime.now(UTC), type="report", days=10)}

    assert_one_line_error(run_cli("prune", *args, env=make_env(db_url)), *fragments)

    assert job_ids(conn) == jobs


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_database_that_is_down_is_one_line() -> None:
    url = f"postgresql://postgres@127.0.0.1:{_closed_port()}/jobsd?connect_timeout=5"
    line = assert_one_line_error(run_cli("prune", env=make_env(url)), "prune failed")
    assert "unavailable" in line, line


def test_no_database_configured_is_one_line() -> None:
    assert_one_line_error(run_cli("prune", env=make_env(None)), "JOBSD_DATABASE_URL")


def test_plaintext_tcp_is_refused_unless_allowed(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    set_retention(conn, "default", 1)
    jobs = {make_job(conn, datetime.now(UTC), days=10)}
    env = make_env(db_url)
    del env["JOBSD_ALLOW_INSECURE"]

    assert_one_line_error(run_cli("prune", env=env), "refusing an unencrypted")

    assert job_ids(conn) == jobs
