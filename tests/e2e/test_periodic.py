"""Periodic jobs end to end: two ``jobsd run`` daemons with a JOBSD_SCHEDULES file.

The scheduler's cases (three schedulers over 25 ticks, catch-up, DST, pause,
refusals) are in tests/service/test_scheduler.py on a pinned clock; the commands in
tests/db/test_db_schedules.py.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.waiting import poll

from .conftest import Proc, make_env, scalar

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


def test_two_daemons_fire_each_tick_once(
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

    poll(lambda: beat_jobs() >= 3, what="three ticks of 'beat'", timeout_s=30)
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
    assert scalar(conn, "SELECT count(*) FROM jobsd.jobs WHERE status = 'succeeded'") > 0
    assert scalar(conn, "SELECT last_tick FROM jobsd.schedules WHERE id = 'nightly'") is None
