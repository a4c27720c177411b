"""Check that a job's history (``jobsd.all_job_events``: the stored events and those its
row stands for) holds every transition of every job, without gaps.

Shared by the service and end-to-end tests: each test calls it on its database at the
end. A job's events must form one chain: the first comes from nothing, each next one
starts where the previous ended, every step is an edge of the state machine
(``jobsd.models.TRANSITIONS``, docs/states.md), the last ends in the job's current
status with its current attempt count, and nothing ever leaves a terminal state.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from psycopg.rows import dict_row

__all__ = ["assert_history_complete", "assert_history_complete_async", "history_problems"]

from jobsd.models import INITIAL_STATES, TRANSITIONS, JobStatus

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

# one snapshot for both reads, even while daemons still write
_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"
_JOBS = "SELECT id, status, attempts FROM jobsd.jobs"
_EVENTS = (
    "SELECT job_id, from_status, to_status, attempt, reason FROM jobsd.all_job_events "
    "ORDER BY job_id, id"
)


def history_problems(
    jobs: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]]
) -> list[str]:
    """Return one line per way the events fail to account for the jobs (empty: all good)."""
    chains: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for event in events:
        chains[event["job_id"]].append(event)
    problems: list[str] = []
    for job in jobs:
        job_id, chain = job["id"], chains.pop(job["id"], [])
        if not chain:
            problems.append(f"{job_id}: no events")
            continue
        if chain[0]["from_status"] is not None:
            problems.append(f"{job_id}: first event comes from {chain[0]['from_status']!r}")
        elif chain[0]["to_status"] not in INITIAL_STATES:
            problems.append(f"{job_id}: born {chain[0]['to_status']!r}")
        for event in chain[1:]:
            before, after = event["from_status"], event["to_status"]
            if before == after:
                # a note, not a transition: a discarded result (fencing evidence), a
                # cancel request, a retry made
                if not _is_note(event):
                    problems.append(f"{job_id}: {before!r} -> itself without a discard note")
                continue
            if before in TRANSITIONS and JobStatus(after) not in TRANSITIONS[JobStatus(before)]:
                problems.append(f"{job_id}: illegal transition {before!r} -> {after!r}")
        for before, after in itertools.pairwise(chain):
            if after["from_status"] != before["to_status"]:
                problems.append(
                    f"{job_id}: gap {before['to_status']!r} then "
                    f"{after['from_status']!r} -> {after['to_status']!r}"
                )
            # a discard note on an ended job leaves its state as it is
            if before["to_status"] in TERMINAL and not _is_note(after):
                problems.append(f"{job_id}: left terminal state {before['to_status']!r}")
            if after["attempt"] < before["attempt"]:
                problems.append(f"{job_id}: attempt went down to {after['attempt']}")
            claimed = after["to_status"] == "running" != after["from_status"]
            if claimed and after["attempt"] != before["attempt"] + 1:
                problems.append(f"{job_id}: claim did not count an attempt ({after['attempt']})")
        last = chain[-1]
        if last["to_status"] != job["status"]:
            problems.append(
                f"{job_id}: last event ends in {last['to_status']!r}, job is {job['status']!r}"
            )
        if last["attempt"] != job["attempts"]:
            problems.append(
                f"{job_id}: last event attempt {last['attempt']}, job has {job['attempts']}"
            )
    problems.extend(f"{job_id}: events of a missing job" for job_id in chains)
    return problems


def _is_note(event: Mapping[str, Any]) -> bool:
    """Tell a note (from = to: a discarded result, a cancel request, a retry made) from
    a transition."""
    return event["from_status"] == event["to_status"] and str(event.get("reason") or "").startswith(
        ("result discarded", "cancel requested", "retried as")
    )


def _report(problems: list[str], jobs: int) -> None:
    assert jobs > 0, "no jobs in the database: the history check would prove nothing"
    assert not problems, f"job_events incomplete for {len(problems)} cases:\n" + "\n".join(
        problems[:20]
    )


def assert_history_complete(conn: psycopg.Connection[Any]) -> int:
    """Check every job of the database; return how many jobs were checked."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(_SNAPSHOT)
        jobs = cur.execute(_JOBS).fetchall()
        events = cur.execute(_EVENTS).fetchall()
    _report(history_problems(jobs, events), len(jobs))
    return len(jobs)


async def assert_history_complete_async(conn: psycopg.AsyncConnection[Any]) -> int:
    """Check every job of the database over an async connection; return the job count."""
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_SNAPSHOT)
        jobs = await (await cur.execute(_JOBS)).fetchall()
        events = await (await cur.execute(_EVENTS)).fetchall()
    _report(history_problems(jobs, events), len(jobs))
    return len(jobs)
