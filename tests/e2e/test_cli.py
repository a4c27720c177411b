"""The command line: what it prints, its exit codes, and one-line errors."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.history import assert_history_complete

from jobsd.dev.embedded import EmbeddedPostgres

from .conftest import Proc, make_env, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def assert_one_line_error(result: Any, *fragments: str) -> str:
    """Check an error exit: non-zero, one ``jobsd: error:`` line on stderr, no traceback."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    # JOBSD_ALLOW_INSECURE's warning (the test server is plain TCP) is a log line, not the error
    lines = [
        line
        for line in result.stderr.strip().splitlines()
        if not line.startswith("WARNING security.insecure_connection_allowed")
    ]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    assert lines[0].startswith("jobsd: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.stdout == "", "nothing on stdout when nothing was done"
    return lines[0]


@pytest.fixture
def daemon(db_url: str, spawn: Callable[..., Proc]) -> Iterator[Proc]:
    """Run a daemon with the e2e handlers on the test's database; stop it after the test."""
    proc = spawn("run", env=make_env(db_url))
    proc.wait_ready()
    yield proc
    proc.send(signal.SIGTERM)
    assert proc.wait(20) == 0


def test_enqueue_prints_the_id_alone_and_wait_exit_codes(
    db_url: str, conn: psycopg.Connection[Any], daemon: Proc
) -> None:
    env = make_env(db_url)
    plain = run_cli("enqueue", "noop", "--org", "acme", env=env)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.count("\n") == 1
    job_id = uuid.UUID(plain.stdout.strip())
    assert conn.execute("SELECT org_id FROM jobsd.jobs WHERE id = %s", (job_id,)).fetchone() == (
        "acme",
    )

    ok = run_cli(
        "enqueue", "sleep", "--org", "acme", "--payload", '{"seconds": 0.3}', "--wait", env=env
    )
    assert ok.returncode == 0, ok.stderr
    ok_id = uuid.UUID(ok.stdout.strip())
    assert ok.stdout.count("\n") == 1, "progress goes to stderr, the id alone to stdout"
    assert "succeeded" in ok.stderr

    bad = run_cli(
        "enqueue",
        "always_fails",
        "--org",
        "acme",
        "--payload",
        '{"message": "boom"}',
        "--wait",
        env=env,
    )
    assert bad.returncode == 3, bad
    bad_id = uuid.UUID(bad.stdout.strip())
    assert "Traceback" not in bad.stderr
    last = bad.stderr.strip().splitlines()[-1]
    assert last == f"jobsd: error: job {bad_id} failed: RuntimeError: boom"

    shown = run_cli("status", str(bad_id), "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["id"] == str(bad_id)
    assert data["status"] == "failed"
    assert data["error"] == "RuntimeError: boom"
    assert [(e["from"], e["to"]) for e in data["history"]] == [
        (None, "queued"),
        ("queued", "running"),
        ("running", "failed"),
    ]
    assert all(e["at"] and e["attempt"] in (0, 1) for e in data["history"])

    text = run_cli("status", str(ok_id), env=env)
    assert text.returncode == 0, text.stderr
    assert "succeeded" in text.stdout
    assert "history" in text.stdout
    assert "queued -> running" in text.stdout
    assert_history_complete(conn)


def test_status_shows_a_reservation_while_the_job_is_queued(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    env = make_env(db_url)
    job_id = _noop_set(
        env,
        conn,
        "worker_id = 'host:42:a', lease_id = gen_random_uuid(), "
        "reserved_until = now() + interval '2 seconds'",
    )
    lines = _status_lines(env, job_id)
    assert "queued" in lines["status"]
    assert "by host:42:a until" in lines["reserved"]
    shown = json.loads(run_cli("status", job_id, "--json", env=env).stdout)
    assert shown["reserved_until"] is not None


def test_status_shows_how_long_a_running_handler_has_been_silent(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    env = make_env(db_url)
    # running for 2 minutes, its last progress 90 s ago
    job_id = _noop_set(
        env,
        conn,
        "status = 'running', attempts = 1, worker_id = 'host:42:a', "
        "lease_id = gen_random_uuid(), started_at = now() - interval '2 minutes', "
        "progress = jsonb_build_object('done', 1, 'updated_at', now() - interval '90 s')",
    )
    lines = _status_lines(env, job_id)
    silent = float(lines["silent"].split()[1])
    assert 90 <= silent < 150, lines["silent"]
    conn.execute("UPDATE jobsd.jobs SET status = 'succeeded' WHERE id = %s", (job_id,))
    assert "silent" not in _status_lines(env, job_id)


def _noop_set(env: dict[str, str], conn: psycopg.Connection[Any], assignments: str) -> str:
    """Enqueue a noop job with the CLI, then set its columns (``assignments``) by hand."""
    made = run_cli("enqueue", "noop", "--org", "acme", env=env)
    assert made.returncode == 0, made.stderr
    job_id = made.stdout.strip()
    conn.execute(f"UPDATE jobsd.jobs SET {assignments} WHERE id = %s", (job_id,))  # type: ignore[arg-type]
    return job_id


def _status_lines(env: dict[str, str], job_id: str) -> dict[str, str]:
    """Run ``jobsd status`` and map each line's label to the line."""
    text = run_cli("status", job_id, env=env)
    assert text.returncode == 0, text.stderr
    return {line.split("  ", 1)[0]: line for line in text.stdout.splitlines()}


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["enqueue", "noop", "--org", "acme", "--payload", "{not json"], ["--payload"]),
        (["enqueue", "noop", "--org", "acme", "--payload", "[1, 2]"], ["JSON object"]),
        (["enqueue", "noop", "--org", "acme", "--payload", '{"x": NaN}'], ["payload"]),
        (["enqueue", "noop", "--org", "acme", "--queue", "nope"], ["unknown queue", "nope"]),
        (["status", "not-a-uuid"], ["not a job id"]),
        (["status", "01a22000-0000-7000-8000-000000000000"], ["not found"]),
    ],
    ids=["bad-json", "not-object", "nan", "unknown-queue", "bad-id", "unknown-id"],
)
def test_bad_input_is_one_line_on_stderr(
    db_url: str, conn: psycopg.Connection[Any], args: list[str], fragments: list[str]
) -> None:
    assert_one_line_error(run_cli(*args, env=make_env(db_url)), *fragments)
    assert conn.execute("SELECT count(*) FROM jobsd.jobs").fetchone() == (0,), "no job created"


def test_no_database_configured_is_one_line_on_stderr() -> None:
    env = make_env(None)
    for args in (["enqueue", "noop", "--org", "acme"], ["status", str(uuid.uuid4())], ["run"]):
        assert_one_line_error(run_cli(*args, env=env), "JOBSD_DATABASE_URL")


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        (None, "No module named"),
        ("raise RuntimeError('missing API key')\n", "RuntimeError: missing API key"),
        ("def broken(:\n", "SyntaxError"),
    ],
    ids=["missing", "raises", "syntax-error"],
)
def test_a_broken_handler_module_is_one_line_on_stderr(
    db_url: str, tmp_path: Path, source: str | None, fragment: str
) -> None:
    name = f"handlers_{uuid.uuid4().hex[:8]}"
    if source is not None:
        (tmp_path / f"{name}.py").write_text(source)
    env = make_env(db_url, JOBSD_HANDLERS=name)
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    assert_one_line_error(run_cli("run", env=env), name, fragment)


def test_an_unreachable_database_is_one_line_on_stderr(
    make_cluster: Callable[..., EmbeddedPostgres],
) -> None:
    cluster = make_cluster()
    url = cluster.url()
    cluster.stop()
    env = make_env(url)
    for args in (
        ["enqueue", "noop", "--org", "acme", "--wait"],
        ["status", str(uuid.uuid4()), "--json"],
        ["migrate"],
        ["notify", "status"],
    ):
        line = assert_one_line_error(run_cli(*args, env=env))
        assert "unavailable" in line or "connect" in line, line


def test_migrate_twice_then_up_to_date(empty_db_url: str) -> None:
    env = make_env(empty_db_url)
    first = run_cli("migrate", env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("applied 0001_")
    second = run_cli("migrate", env=env)
    assert second.returncode == 0, second.stderr
    assert second.stdout == "schema up to date\n"


def test_run_refuses_an_unmigrated_database(empty_db_url: str) -> None:
    assert_one_line_error(run_cli("run", env=make_env(empty_db_url)), "jobsd migrate")


def test_cancel_a_queued_job_then_a_running_one_then_a_finished_one(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    env = make_env(db_url)
    queued = run_cli("enqueue", "noop", "--org", "acme", env=env).stdout.strip()
    done = run_cli("cancel", queued, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"job {queued} cancelled"
    row = conn.execute("SELECT status, reason FROM jobsd.jobs WHERE id = %s", (queued,)).fetchone()
    assert row == ("cancelled", "cancelled by operator")
    actor = conn.execute(
        "SELECT worker_id FROM jobsd.all_job_events WHERE job_id = %s AND to_status = 'cancelled'",
        (queued,),
    ).fetchone()
    assert actor is not None and str(actor[0]).startswith("cli:"), actor

    running = run_cli("enqueue", "noop", "--org", "acme", env=env).stdout.strip()
    conn.execute(
        "UPDATE jobsd.jobs SET status = 'running', attempts = 1, started_at = now(), "
        "lease_id = gen_random_uuid(), worker_id = 'w' WHERE id = %s",
        (running,),
    )
    asked = run_cli("cancel", running, env=env)
    assert asked.returncode == 0 and "cancel requested" in asked.stdout
    requested = conn.execute(
        "SELECT status, cancel_requested_at IS NOT NULL FROM jobsd.jobs WHERE id = %s",
        (running,),
    ).fetchone()
    assert requested == ("running", True)

    conn.execute("UPDATE jobsd.jobs SET status = 'succeeded' WHERE id = %s", (running,))
    assert_one_line_error(run_cli("cancel", running, env=env), "already succeeded")
    assert_one_line_error(run_cli("cancel", str(uuid.uuid4()), env=env), "not found")
    assert_one_line_error(run_cli("cancel", "nope", env=env), "not a job id")


def test_resolve_settles_a_recovery_required_job_and_only_such(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    env = make_env(db_url)
    ids = [run_cli("enqueue", "noop", "--org", "acme", env=env).stdout.strip() for _ in range(3)]
    for job_id in ids:
        conn.execute(
            "UPDATE jobsd.jobs SET status = 'running', attempts = 1, worker_id = 'w' WHERE id = %s",
            (job_id,),
        )
        conn.execute(
            "UPDATE jobsd.jobs SET status = 'recovery_required', reason = 'worker lost' "
            "WHERE id = %s",
            (job_id,),
        )
    for job_id, flag, status in zip(
        ids,
        ("--succeeded", "--failed", "--requeue"),
        ("succeeded", "failed", "queued"),
        strict=True,
    ):
        done = run_cli("resolve", job_id, flag, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"job {job_id} {status}"
        event = conn.execute(
            "SELECT from_status, to_status, worker_id, reason FROM jobsd.all_job_events "
            "WHERE job_id = %s ORDER BY id DESC LIMIT 1",
            (job_id,),
        ).fetchone()
        assert event is not None and event[:2] == ("recovery_required", status), event
        assert str(event[2]).startswith("cli:") and event[3].startswith("resolved as "), event
    assert_one_line_error(run_cli("resolve", ids[0], "--failed", env=env), "not recovery_required")
    assert_one_line_error(run_cli("resolve", ids[0], env=env), "--succeeded")
