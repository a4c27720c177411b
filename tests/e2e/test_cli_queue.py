"""``jobsd queue ...`` as a subprocess: what it prints, what it changes, one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from support.jobs import make_job

from .conftest import make_env, run_cli, scalar

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

INSECURE_WARNING = (
    "jobsd: warning: TCP host 127.0.0.1 with sslmode=prefer (allowed by JOBSD_ALLOW_INSECURE)"
)


def ok(result: subprocess.CompletedProcess[str]) -> list[str]:
    """Check a success: exit 0, nothing on stderr but the insecure-connection warning."""
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line != INSECURE_WARNING] == []
    return result.stdout.splitlines()


def one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Check a failure: exit 1, one ``jobsd: error:`` line, nothing on stdout."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line != INSECURE_WARNING]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("jobsd: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.stdout == ""
    return lines[0]


def queues(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT name, capacity, concurrency_limit, retention_days, paused_at IS NOT NULL "
        "FROM jobsd.queues ORDER BY name"
    ).fetchall()


def add_job(conn: psycopg.Connection[Any], queue: str, org_id: str, status: str) -> None:
    make_job(conn, queue=queue, org_id=org_id, status=status)


@pytest.mark.heavy
def test_create_list_set_pause_resume_drop(db_url: str, conn: psycopg.Connection[Any]) -> None:
    env = make_env(db_url)

    def jobsd(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli("queue", *args, env=env)

    assert ok(jobsd("create", "mail", "--capacity", "100", "--retention", "30")) == [
        "queue 'mail' created  capacity=100  concurrency_limit=default  retention=30d"
    ]
    ok(jobsd("create", "reports", "--concurrency-limit", "2", "--capacity", "none"))
    assert queues(conn) == [
        ("default", None, None, None, False),
        ("mail", 100, None, 30, False),
        ("reports", None, 2, None, False),
    ]
    one_line_error(jobsd("create", "mail", "--capacity", "5"), "queue 'mail' exists already")
    assert queues(conn)[1] == ("mail", 100, None, 30, False)

    add_job(conn, "mail", "acme", "queued")
    add_job(conn, "mail", "globex", "queued")
    add_job(conn, "mail", "globex", "running")
    add_job(conn, "mail", "acme", "succeeded")
    assert ok(jobsd("list")) == [
        "default  active  capacity=none  concurrency_limit=default  retention=none  queued=0  "
        "scheduled=0  blocked=0  running=0  recovery_required=0  unhandled=0",
        "mail     active  capacity=100   concurrency_limit=default  retention=30d   queued=2  "
        "scheduled=0  blocked=0  running=1  recovery_required=0  unhandled=2",
        "reports  active  capacity=none  concurrency_limit=2        retention=none  queued=0  "
        "scheduled=0  blocked=0  running=0  recovery_required=0  unhandled=0",
    ]
    listed = [json.loads(line) for line in ok(jobsd("list", "--json"))]
    assert [q["name"] for q in listed] == ["default", "mail", "reports"]
    assert listed[1]["depth"] == {
        "queued": 2,
        "scheduled": 0,
        "blocked": 0,
        "running": 1,
        "recovery_required": 0,
    }
    assert (listed[1]["capacity"], listed[1]["retention_days"], listed[1]["paused"]) == (
        100,
        30,
        False,
    )

    assert ok(jobsd("set", "mail", "--capacity", "none", "--concurrency-limit", "4")) == [
        "queue 'mail' updated  capacity=none  concurrency_limit=4  retention=30d"
    ]
    assert queues(conn)[1] == ("mail", None, 4, 30, False)
    # a capacity under the open jobs: accepted, with a warning on stderr
    lowered = jobsd("set", "mail", "--capacity", "2", "--retention", "none")
    assert lowered.returncode == 0, lowered.stderr
    assert (
        lowered.stdout == "queue 'mail' updated  capacity=2  concurrency_limit=4  retention=none\n"
    )
    assert (
        "jobsd: warning: queue 'mail' holds 3 open jobs, its capacity is 2: enqueues are "
        "refused until fewer than 2 are open"
    ) in lowered.stderr
    assert queues(conn)[1] == ("mail", 2, 4, None, False)
    one_line_error(jobsd("set", "mail"), "nothing to change")

    paused = ok(jobsd("pause", "mail"))
    assert re.fullmatch(
        r"queue 'mail' paused since \S+: no new claims; running jobs finish", paused[0]
    )
    assert ok(jobsd("pause", "mail")) == paused  # idempotent: the first pause time stays
    assert queues(conn)[1][4] is True
    assert ok(jobsd("list"))[1].startswith("mail     paused  ")
    assert ok(jobsd("resume", "mail")) == ["queue 'mail' resumed: 2 queued jobs to claim"]
    assert ok(jobsd("resume", "mail")) == ["queue 'mail' resumed: 2 queued jobs to claim"]
    assert queues(conn)[1][4] is False

    refused = one_line_error(jobsd("drop", "mail"), "queue 'mail' holds 3 open jobs")
    assert "nothing was dropped" in refused
    assert scalar(conn, "SELECT count(*) FROM jobsd.jobs WHERE queue = 'mail'") == 4
    conn.execute(
        "UPDATE jobsd.jobs SET status = 'cancelled', finished_at = now() WHERE status = 'queued'"
    )
    conn.execute(
        "UPDATE jobsd.jobs SET status = 'failed', finished_at = now() WHERE status = 'running'"
    )
    assert ok(jobsd("drop", "mail")) == ["queue 'mail' dropped, with its 4 finished jobs"]
    assert ok(jobsd("drop", "reports")) == ["queue 'reports' dropped, with its 0 finished jobs"]
    assert queues(conn) == [("default", None, None, None, False)]
    assert scalar(conn, "SELECT count(*) FROM jobsd.jobs") == 0


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["create", "bad name"], ["invalid queue name 'bad name'"]),
        (["create", "x" * 64], ["invalid queue name"]),
        (["pause", "--", "-x"], ["invalid queue name '-x'"]),
        (["create", "mail", "--capacity", "0"], ["--capacity must be a positive integer"]),
        (["create", "mail", "--capacity", "-3"], ["--capacity must be a positive integer"]),
        (["create", "mail", "--capacity", "ten"], ["not 'ten'"]),
        (["create", "mail", "--capacity", "2147483648"], ["at most 2147483647"]),
        (["create", "mail", "--concurrency-limit", "0"], ["--concurrency-limit must be"]),
        (["create", "mail", "--retention", "-1"], ["--retention must be an integer >= 0"]),
        (["set", "default", "--capacity", "0"], ["--capacity must be a positive integer"]),
        (["pause", "nope"], ["unknown queue 'nope' (see `jobsd queue list`)"]),
        (["resume", "nope"], ["unknown queue 'nope'"]),
        (["set", "nope", "--capacity", "3"], ["unknown queue 'nope'"]),
        (["drop", "nope"], ["unknown queue 'nope'"]),
        (["drop", "default"], ["the queue 'default' cannot be dropped", "pause it instead"]),
    ],
)
def test_bad_input_is_one_line_and_exit_1(
    db_url: str, conn: psycopg.Connection[Any], args: list[str], fragments: list[str]
) -> None:
    before = queues(conn)
    one_line_error(run_cli("queue", *args, env=make_env(db_url)), *fragments)
    assert queues(conn) == before


def test_database_url_option_and_the_connection_check(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    # --database-url without JOBSD_DATABASE_URL
    bare = make_env(None)
    ok(run_cli("queue", "create", "mail", "--database-url", db_url, env=bare))
    assert [q[0] for q in queues(conn)] == ["default", "mail"]
    one_line_error(run_cli("queue", "list", env=bare), "no database configured")
    # plaintext TCP is refused unless allowed, like every command that connects
    strict = make_env(db_url, JOBSD_ALLOW_INSECURE="0")
    one_line_error(run_cli("queue", "drop", "mail", env=strict), "refusing an unencrypted")
    assert [q[0] for q in queues(conn)] == ["default", "mail"]
    # a database that is not there
    gone = make_env(make_conninfo(db_url, dbname="no_such_database_here"))
    one_line_error(run_cli("queue", "list", env=gone), "listing of the queues failed")


def test_token_create_admin_and_token_list(db_url: str, conn: psycopg.Connection[Any]) -> None:
    env = make_env(db_url)
    # an admin token is an operator's: it belongs to no org
    refused = run_cli("token", "create", "--org", "acme", "--admin", env=env)
    assert refused.returncode == 1 and "belongs to no org" in refused.stderr
    made = run_cli("token", "create", "--name", "ops", "--admin", env=env)
    assert made.returncode == 0, made.stderr
    assert re.fullmatch(r"jobsd_[A-Za-z0-9_-]{43}\n", made.stdout)
    assert "admin token " in made.stderr and "for operators (no org)" in made.stderr
    plain = run_cli("token", "create", "--org", "acme", "--name", "web", env=env)
    assert plain.returncode == 0 and "admin" not in plain.stderr
    assert conn.execute("SELECT name, admin FROM jobsd.api_tokens ORDER BY name").fetchall() == [
        ("ops", True),
        ("web", False),
    ]
    lines = run_cli("token", "list", env=env).stdout.splitlines()
    assert [line.split("  ")[3] for line in lines] == ["ops", "web"]
    assert [line.split("  ")[-1] for line in lines] == ["admin", "-"]
    listed = [
        json.loads(line) for line in run_cli("token", "list", "--json", env=env).stdout.splitlines()
    ]
    assert [(t["name"], t["admin"]) for t in listed] == [("ops", True), ("web", False)]
