"""The schedules in the database and the ``jobsd schedule`` commands (in-process).

What each command prints and changes, its one-line errors; the daemon's check of
``JOBSD_SCHEDULES`` at start and ``JOBSD_SCHEDULER=false``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import psycopg
import pytest
from click.testing import CliRunner

from jobsd.cli.app import main
from jobsd.periodic import Schedule, ScheduleRegistry
from jobsd.settings import Settings
from jobsd.store import schedules as store
from jobsd.store.connect import connect_async
from jobsd.worker.supervisor import Daemon

NIGHTLY = Schedule.build(
    "30 2 * * *", id="nightly", type="purge", org_id="acme", timezone="Europe/Paris"
)
NIGHTLY_ZONE = ZoneInfo("Europe/Paris")
BEAT = Schedule.build(id="beat", type="beat", org_id="acme", every="30s")


def declare(db_url: str, *schedules: Schedule, now: datetime | None = None) -> None:
    async def run() -> None:
        async with connect_async(db_url, application_name="test", operation="test") as conn:
            await store.upsert(conn, [s.row() for s in schedules], now)

    anyio.run(run)


def errors(stderr: str) -> list[str]:
    """Return the lines of stderr but the insecure-connection warnings."""
    return [line for line in stderr.splitlines() if "INSECURE" not in line.upper()]


@pytest.fixture
def cli(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("JOBSD_DATABASE_URL", db_url)
    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "1")
    runner = CliRunner()

    def invoke(*args: str) -> Any:
        return runner.invoke(main, ["schedule", *args])

    return invoke


def test_list_pause_resume(cli: Any, db_url: str, conn: psycopg.Connection[Any]) -> None:
    empty = cli("list")
    assert empty.exit_code == 0 and empty.stdout.startswith("no schedules")
    declare(db_url, NIGHTLY, BEAT)

    listed = cli("list")
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:4] == ["ID", "SCHEDULE", "TIMEZONE", "STATE"]
    assert [r.split()[:4] for r in rows] == [
        ["beat", "every", "30s", "UTC"],
        ["nightly", "30", "2", "*"],
    ]
    assert "Europe/Paris" in rows[1] and "active" in rows[1]

    paused = cli("pause", "beat")
    assert paused.exit_code == 0 and paused.stdout.startswith("schedule 'beat' paused since ")
    assert conn.execute("SELECT paused FROM jobsd.schedules WHERE id = 'beat'").fetchone() == (
        True,
    )
    as_json = [json.loads(line) for line in cli("list", "--json").stdout.splitlines()]
    assert [(s["id"], s["paused"], s["spec"]) for s in as_json] == [
        ("beat", True, "every 30s"),
        ("nightly", False, "30 2 * * *"),
    ]
    assert as_json[0]["next_tick"] is None  # paused: no next tick
    next_nightly = datetime.fromisoformat(as_json[1]["next_tick"])
    assert next_nightly.astimezone(NIGHTLY_ZONE).strftime("%H:%M") in ("02:30", "03:00")
    assert as_json[1]["last_tick"] is None and as_json[1]["last_state"] is None

    resumed = cli("resume", "beat")
    assert resumed.exit_code == 0 and "resumed: next tick " in resumed.stdout
    row = conn.execute(
        "SELECT paused, paused_at, resumed_at IS NOT NULL FROM jobsd.schedules WHERE id = 'beat'"
    ).fetchone()
    assert row == (False, None, True)
    assert cli("resume", "beat").exit_code == 0  # idempotent

    for verb in ("pause", "resume"):
        unknown = cli(verb, "nope")
        assert unknown.exit_code == 1 and unknown.stdout == ""
        assert errors(unknown.stderr) == [
            "jobsd: error: unknown schedule 'nope' (see `jobsd schedule list`)"
        ]


def test_a_redeclaration_changes_the_definition_not_the_state(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    declare(db_url, BEAT, now=datetime(2026, 1, 1, tzinfo=UTC))
    conn.execute("UPDATE jobsd.schedules SET paused = true, fired = 7 WHERE id = 'beat'")
    declare(db_url, Schedule.build(id="beat", type="beat", org_id="acme", every="1m"))
    row = conn.execute(
        "SELECT every_ms, paused, fired, created_at FROM jobsd.schedules WHERE id = 'beat'"
    ).fetchone()
    assert row == (60_000, True, 7, datetime(2026, 1, 1, tzinfo=UTC))


def test_a_bad_schedules_file_is_one_line_at_start(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[schedules]]\nid = "x"\ncron = "61 * * * *"\ntype = "t"\norg_id = "a"\n')
    monkeypatch.setenv("JOBSD_DATABASE_URL", db_url)
    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "1")
    monkeypatch.setenv("JOBSD_SCHEDULES", str(path))
    result = CliRunner().invoke(main, ["run"])
    assert result.exit_code == 1
    [line] = errors(result.stderr)
    assert line.startswith("jobsd: error: JOBSD_SCHEDULES=")
    assert "schedule #1: schedule 'x': bad cron expression '61 * * * *'" in line
    assert conn_count(db_url) == 0  # nothing declared


def conn_count(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM jobsd.schedules").fetchone()
    assert row is not None
    return int(row[0])


def test_jobsd_scheduler_false_runs_no_scheduler(db_url: str) -> None:
    registry = ScheduleRegistry()
    registry.add(BEAT)

    async def build(enabled: bool) -> Daemon:
        settings = Settings(database_url=db_url, scheduler=enabled)
        return Daemon(settings, schedules=registry)

    assert anyio.run(build, True).scheduler is not None
    assert anyio.run(build, False).scheduler is None
    # nothing declared: no scheduler, whatever the setting
    assert anyio.run(lambda: _daemon_without_schedules(db_url)).scheduler is None


async def _daemon_without_schedules(db_url: str) -> Daemon:
    return Daemon(Settings(database_url=db_url), schedules=ScheduleRegistry())
