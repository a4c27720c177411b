"""Periodic jobs end to end: ``jobsd run`` daemons with a JOBSD_SCHEDULES file, and
``jobsd schedule list|pause|resume`` as subprocesses."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from .conftest import Proc, make_env, run_cli, scalar

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SCHEDULES = """
[[schedules]]
id = "beat"
every = "1s"
type = "noop"
org_id = "acme"
payload = { source = "toml" }

[[schedules]]
id = "nightly"
cron = "30 2 * * *"
timezone = "Europe/Paris"
type = "noop"
org_id = "acme"
"""


def poll(check: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def ok(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout.splitlines()


def test_two_daemons_fire_each_tick_once_and_the_cli_pauses_and_resumes(
    db_url: str,
    conn: psycopg.Connection[Any],
    spawn: Callable[..., Proc],
    tmp_path: Path,
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(SCHEDULES)
    env = make_env(db_url, JOBSD_HANDLERS="e2e_handlers", JOBSD_SCHEDULES=str(path))
    daemons = [spawn("run", env=env) for _ in range(2)]
    for daemon in daemons:
        daemon.wait_ready()

    def beat_jobs() -> int:
        return int(
            scalar(conn, "SELECT count(*) FROM jobsd.jobs WHERE payload->'_schedule'->>'id'='beat'")
        )

    poll(lambda: beat_jobs() >= 4, "four ticks of 'beat'")
    cli = make_env(db_url)
    ok(run_cli("schedule", "pause", "beat", env=cli))
    paused_at = beat_jobs()
    listed = [json.loads(line) for line in ok(run_cli("schedule", "list", "--json", env=cli))]
    assert [(s["id"], s["paused"], s["timezone"]) for s in listed] == [
        ("beat", True, "UTC"),
        ("nightly", False, "Europe/Paris"),
    ]
    assert listed[0]["next_tick"] is None and listed[0]["spec"] == "every 1s"
    assert listed[1]["next_tick"].endswith(("T00:30:00+00:00", "T01:30:00+00:00"))
    table = ok(run_cli("schedule", "list", env=cli))
    assert table[0].split()[:3] == ["ID", "SCHEDULE", "TIMEZONE"]
    assert table[1].startswith("beat") and "paused" in table[1]

    # no tick fires while paused: let two ticks' time pass on the database's clock
    paused_since = scalar(conn, "SELECT paused_at FROM jobsd.schedules WHERE id = 'beat'")
    poll(
        lambda: scalar(conn, "SELECT now() > %s + interval '2.5 s'", (paused_since,)),
        "two ticks' time",
    )
    assert beat_jobs() <= paused_at + 1  # at most one tick was in flight at the pause
    ok(run_cli("schedule", "resume", "beat", env=cli))
    poll(lambda: beat_jobs() >= paused_at + 2, "ticks after the resume")

    for daemon in daemons:
        daemon.send(signal.SIGTERM)
    assert [daemon.wait() for daemon in daemons] == [0, 0]
    dupes = scalar(
        conn,
        "SELECT count(*) FROM (SELECT payload->'_schedule'->>'tick' FROM jobsd.jobs "
        "GROUP BY 1 HAVING count(*) > 1) AS d",
    )
    assert dupes == 0
    assert scalar(conn, "SELECT fired FROM jobsd.schedules WHERE id = 'beat'") == beat_jobs()
    assert scalar(conn, "SELECT count(*) FROM jobsd.jobs WHERE payload->>'source' = 'toml'") > 0

    bad = run_cli("schedule", "pause", "nope", env=cli)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.strip().endswith(
        "jobsd: error: unknown schedule 'nope' (see `jobsd schedule list`)"
    )


def test_a_bad_schedules_file_stops_the_daemon_at_start_with_one_line(
    db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[schedules]]\nid = "x"\ncron = "61 * * * *"\ntype = "t"\norg_id = "a"\n')
    result = run_cli("run", env=make_env(db_url, JOBSD_SCHEDULES=str(path)))
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(lines) == 1, result.stderr
    assert "schedule #1: schedule 'x': bad cron expression '61 * * * *'" in lines[0]
    assert "Traceback" not in result.stderr
