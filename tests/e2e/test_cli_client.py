"""The command line of issue 14: ``jobsd retry`` (``--force`` for an at_most_once
type), ``jobsd jobs list``, ``jobsd run`` without handlers and with handlers from the
current directory, ``--run-after`` with offsets, one-line usage errors."""

from __future__ import annotations

import json
import re
import signal
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.jobs import make_job

from .conftest import Proc, job_status, make_env, run_cli, wait_status
from .test_cli import assert_one_line_error

pytestmark = pytest.mark.timeout(120)


def test_retry_runs_a_failed_job_again_as_a_new_job_and_both_histories_say_so(
    db_url: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    env = make_env(db_url)
    daemon = spawn("run", env=env)
    daemon.wait_ready()
    first = run_cli("enqueue", "always_fails", "--org", "acme", "--wait", env=env)
    assert first.returncode == 3, first.stderr
    job_id = first.stdout.splitlines()[0].strip()
    again = run_cli("retry", job_id, env=env)
    assert again.returncode == 0, again.stderr
    said = re.fullmatch(rf"job {job_id} retried as job ([0-9a-f-]{{36}}), queued\n", again.stdout)
    assert said is not None, again.stdout
    new_id = said.group(1)
    row = wait_status(conn, new_id, "failed", timeout_s=30)
    assert row["attempts"] == 1 and str(row["retry_of"]) == job_id
    assert job_status(conn, job_id) == "failed"
    daemon.send(signal.SIGTERM)
    assert daemon.wait(20) == 0
    shown = json.loads(run_cli("status", job_id, "--json", env=env).stdout)
    history = [(e["from"], e["to"], e["attempt"]) for e in shown["history"]]
    assert history == [
        (None, "queued", 0),
        ("queued", "running", 1),
        ("running", "failed", 1),
        ("failed", "failed", 1),
    ]
    note = shown["history"][-1]
    assert note["reason"] == f"retried as {new_id}" and note["worker"].startswith("cli:")
    assert shown["retried_as"] == new_id and shown["status"] == "failed"
    retried = json.loads(run_cli("status", new_id, "--json", env=env).stdout)
    assert retried["retry_of"] == job_id
    assert retried["history"][0]["reason"] == f"retry of {job_id}"
    # asking again answers the same new job
    twice = run_cli("retry", job_id, env=env)
    assert twice.returncode == 0 and new_id in twice.stdout and "retried before" in twice.stdout
    # refusals: one line, nothing changed
    queued = make_job(conn)
    assert_one_line_error(run_cli("retry", str(queued), env=env), "it is queued")
    assert_one_line_error(run_cli("retry", str(uuid.uuid4()), env=env), "not found")
    assert_one_line_error(run_cli("retry", "nope", env=env), "not a job id")


def test_jobs_list_filters_and_json(db_url: str, conn: psycopg.Connection[Any]) -> None:
    env = make_env(db_url)
    a = make_job(conn, org_id="acme", type="mail")
    b = make_job(conn, org_id="globex", type="mail", status="failed")
    make_job(conn, org_id="acme", type="crawl", created_at=datetime(2020, 1, 1, tzinfo=UTC))
    listed = run_cli(
        "jobs", "list", "--type", "mail", "--since", "2021-01-01T00:00:00Z", "--json", env=env
    )
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["id"] for r in rows] == [str(b), str(a)]
    assert "payload" not in rows[0] and rows[0]["status"] == "failed"
    table = run_cli("jobs", "list", "--org", "acme", "--status", "queued", "--since", "1d", env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["ID", "TYPE", "QUEUE", "ORG", "STATUS", "ATTEMPTS", "CREATED"]
    assert [line.split()[:5] for line in lines[1:]] == [
        [str(a), "mail", "default", "acme", "queued"]
    ]
    bad = run_cli("jobs", "list", "--since", "yesterday", env=env)
    assert_one_line_error(bad, "'yesterday' is not a time")


def test_run_without_handlers_refuses_unless_allow_empty(
    db_url: str, spawn: Callable[..., Proc]
) -> None:
    env = make_env(db_url, JOBSD_HANDLERS="")
    assert_one_line_error(run_cli("run", env=env), "no handler registered", "--allow-empty")
    daemon = spawn("run", "--allow-empty", env=env)
    daemon.wait_ready()
    daemon.send(signal.SIGTERM)
    assert daemon.wait(20) == 0


HANDLER_MODULE = """
import jobsd


@jobsd.handler("myapp_hello")
async def hello(ctx: jobsd.JobContext) -> dict[str, str]:
    return {"hello": ctx.payload["name"]}
"""


def test_run_imports_handlers_from_the_current_directory_without_pythonpath(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # README: JOBSD_HANDLERS=myapp.jobs from the project's directory, no PYTHONPATH
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "jobs.py").write_text(HANDLER_MODULE)
    env = make_env(db_url, JOBSD_HANDLERS="myapp.jobs")
    del env["PYTHONPATH"]
    # the installed script: `python -m jobsd` would put the directory on sys.path itself
    script = Path(sys.executable).parent / "jobsd"
    if not script.exists():
        pytest.skip("no installed jobsd script")
    job_id = make_job(conn, type="myapp_hello", payload={"name": "cwd"})
    daemon = Proc(["bash", "-c", f'cd "{tmp_path}" && exec "{script}" run'], env)
    try:
        daemon.wait_ready()
        row = wait_status(conn, job_id, "succeeded")
        assert row["report"] == {"hello": "cwd"}
        daemon.send(signal.SIGTERM)
        assert daemon.wait(20) == 0
    finally:
        daemon.kill()


def test_run_after_takes_iso_8601_with_z(db_url: str, conn: psycopg.Connection[Any]) -> None:
    # offsets, durations and naive times: tests/unit/test_cli_frictions.py
    env = make_env(db_url)
    r = run_cli("enqueue", "noop", "--org", "acme", "--run-after", "2030-01-01T00:00:00Z", env=env)
    assert r.returncode == 0, r.stderr
    run_after = conn.execute(
        "SELECT run_after FROM jobsd.jobs WHERE id = %s", (r.stdout.strip(),)
    ).fetchone()
    assert run_after == (datetime(2030, 1, 1, tzinfo=UTC),)
    bad = run_cli("enqueue", "noop", "--org", "acme", "--run-after", "soon", env=env)
    assert_one_line_error(bad, "--run-after", "'soon' is not a time", "jobsd enqueue --help")
    assert bad.returncode == 2


def test_retry_of_an_at_most_once_type_needs_force(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    env = make_env(db_url)
    # what a daemon with an at_most_once handler of the type records (workers_register)
    conn.execute(
        "INSERT INTO jobsd.job_types (type, delivery, max_attempts) "
        "VALUES ('charge_card', 'at_most_once', 1)"
    )
    job_id = make_job(conn, type="charge_card", status="failed", claim={"attempts": 1})
    refused = run_cli("retry", str(job_id), env=env)
    assert_one_line_error(refused, f"retry of job {job_id} refused", "at_most_once", "--force")
    assert job_status(conn, job_id) == "failed"
    forced = run_cli("retry", str(job_id), "--force", env=env)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.startswith(f"job {job_id} retried as job "), forced.stdout
    first = conn.execute(
        "SELECT e.from_status, e.to_status, e.reason, e.worker_id FROM jobsd.all_job_events AS e "
        "JOIN jobsd.jobs AS j ON j.id = e.job_id WHERE j.retry_of = %s ORDER BY e.id LIMIT 1",
        (job_id,),
    ).fetchone()
    assert first is not None and first[:3] == (None, "queued", f"retry (forced) of {job_id}")
    assert str(first[3]).startswith("cli:"), first
