"""Every line logged during a run carries its job: ``jobsd run`` as a subprocess.

The handlers of ``log_handlers.py`` log through the application's own logger, in the
event loop, in a thread of the daemon and in a handler process. One slot: the jobs run
one after another in the same slot, and the isolated ones in the same child, so a
job's fields leaking into the next one's lines would show.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable
from typing import Any

import anyio
import psycopg
import pytest

import jobsd
from jobsd.client import JobSpec
from jobsd.logs import JOB_FIELDS

from .conftest import Proc, make_env, poll, scalar

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

# (type, org, payload n), enqueued in this order, run one at a time
JOBS = [
    ("log.async", "acme", 1),
    ("log.async", "globex", 2),
    ("log.flaky", "acme", 3),
    ("log.sync", "acme", 4),
    ("log.sync", "globex", 5),
    ("log.isolated", "acme", 6),
    ("log.isolated", "globex", 7),
]

_TEXT_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def _run_jobs(
    db_url: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc], fmt: str
) -> tuple[Proc, dict[int, str]]:
    """Run ``JOBS`` in a one-slot daemon logging in ``fmt``; stop it; return it and
    each job's id by its ``n``."""
    env = make_env(db_url, JOBSD_HANDLERS="log_handlers", JOBSD_SLOTS="1", JOBSD_LOG_FORMAT=fmt)
    daemon = spawn("run", env=env)
    daemon.wait_ready()

    async def enqueue() -> dict[int, str]:
        ids = {}
        async with jobsd.Client(db_url) as client:
            for type_, org, n in JOBS:  # one by one: claim order is enqueue order
                job = await client.enqueue_many([JobSpec.build(type_, {"n": n}, org_id=org)])
                ids[n] = str(job[0].id)
        return ids

    ids = anyio.run(enqueue)
    ended = "SELECT count(*) FROM jobsd.jobs WHERE status IN ('succeeded', 'failed')"
    poll(lambda: scalar(conn, ended) == len(JOBS), what="every job to end", timeout_s=60)
    statuses = conn.execute("SELECT DISTINCT status FROM jobsd.jobs").fetchall()
    assert statuses == [("succeeded",)]
    daemon.send(signal.SIGTERM)
    assert daemon.wait(20) == 0
    return daemon, ids


def _json_lines(proc: Proc) -> list[dict[str, Any]]:
    lines = []
    for line in proc.lines["stderr"]:
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def _text_lines(proc: Proc) -> list[dict[str, Any]]:
    """Parse ``LEVEL event k=v ...`` lines into dicts (``event``: the words before the
    first ``k=v``)."""
    lines = []
    for line in proc.lines["stderr"]:
        level, _, rest = line.partition(" ")
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            continue
        first = _TEXT_FIELD.search(rest)
        event = rest[: first.start()].strip() if first else rest
        fields: dict[str, Any] = {"event": event}
        for key, value in _TEXT_FIELD.findall(rest):
            fields[key] = json.loads(value) if value.startswith('"') else value
        lines.append(fields)
    return lines


def _check(lines: list[dict[str, Any]], ids: dict[int, str], daemon_pid: int) -> None:
    """Each handler line carries its own job; lines outside a run carry none."""
    mails = [line for line in lines if line["event"] == "sending mail"]
    # one line per run: log.flaky ran twice
    assert sorted(int(m["n"]) for m in mails) == [1, 2, 3, 3, 4, 5, 6, 7], mails
    kinds = {n: (type_, org) for type_, org, n in JOBS}
    attempts: dict[int, list[int]] = {}
    for mail in mails:
        n = int(mail["n"])
        type_, org = kinds[n]
        assert mail["job_id"] == ids[n], mail
        assert (mail["type"], mail["org_id"], mail["queue"]) == (type_, org, "default"), mail
        attempts.setdefault(n, []).append(int(mail["attempt"]))
    assert attempts[3] == [1, 2]
    assert all(attempts[n] == [1] for n in attempts if n != 3)
    by_n = {int(m["n"]): m for m in mails}
    # where each ran: the event loop, a thread of its own, the same child for both
    assert {int(by_n[n]["pid"]) for n in (1, 2, 4, 5)} == {daemon_pid}
    assert by_n[4]["thread_name"] == f"job {ids[4]}" and by_n[5]["thread_name"] == f"job {ids[5]}"
    child_pids = {int(by_n[n]["pid"]) for n in (6, 7)}
    assert len(child_pids) == 1 and daemon_pid not in child_pids, "one child, reused"
    # jobsd's own line in a run: the job's fields beside its own extra
    failed = [line for line in lines if line["event"] == "job.handler_failed"]
    assert [(f["job_id"], f["org_id"], int(f["attempt"])) for f in failed] == [(ids[3], "acme", 1)]
    # outside any run: no job field
    outside = [
        line
        for line in lines
        if line["event"] in ("daemon.ready", "daemon.stopping", "daemon.stopped")
        or (line["event"] == "handlers.loaded" and int(line["pid"]) == daemon_pid)
    ]
    assert {line["event"] for line in outside} >= {"daemon.ready", "handlers.loaded"}
    for line in outside:
        assert not set(JOB_FIELDS) & set(line), line


def test_json_lines_carry_the_job_of_their_run(
    db_url: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    daemon, ids = _run_jobs(db_url, conn, spawn, "json")
    lines = _json_lines(daemon)
    _check(lines, ids, daemon.pid)
    mail = next(line for line in lines if line["event"] == "sending mail")
    assert mail["logger"] == "myapp" and isinstance(mail["attempt"], int)


def test_text_lines_carry_the_job_of_their_run(
    db_url: str, conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    daemon, ids = _run_jobs(db_url, conn, spawn, "text")
    _check(_text_lines(daemon), ids, daemon.pid)
    first = next(line for line in daemon.lines["stderr"] if line.startswith("INFO sending mail"))
    assert first.endswith(f"job_id={ids[1]} type=log.async attempt=1 queue=default org_id=acme")
