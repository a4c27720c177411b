"""The per-type figures (migration 0029): jobsd.type_stats kept by the archive's move,
read with the ended jobs not archived yet, each job counted once, within the reader's
org; percentiles within one run-duration bucket; the rollup's retention and backfill."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from support.jobs import make_job

from jobsd.ops import Caller
from jobsd.ops.type_stats import TypeStats, Window, bucket_bounds, read_type_stats
from jobsd.store.migrate import migrate_sync

pytestmark = pytest.mark.anyio

Conn = psycopg.Connection[Any]
AConn = psycopg.AsyncConnection[Any]
OPERATOR = Caller.as_operator("tests")


@dataclass(frozen=True)
class Ended:
    """A job to make: who, what, how it ended, how long ago, how long its run took."""

    org: str
    type: str
    status: str
    ago_s: float
    run_s: float | None  # None: never started


def make_ended(conn: Conn, now: datetime, job: Ended) -> uuid.UUID:
    finished = now - timedelta(seconds=job.ago_s)
    started = None if job.run_s is None else finished - timedelta(seconds=job.run_s)
    created = (started or finished) - timedelta(seconds=5)
    return make_job(
        conn,
        status=job.status,
        org_id=job.org,
        type=job.type,
        created_at=created,
        run_after=created,
        started_at=started,
        finished_at=finished,
    )


def spread() -> list[Ended]:
    """Jobs of org a's type resize over the last day, durations 4 ms to 40 s."""
    jobs = []
    for i in range(60):
        status = "failed" if i % 7 == 0 else "cancelled" if i % 11 == 0 else "succeeded"
        # even: within the last hour (2-52 min ago); odd: 2-21 hours ago
        ago = 120 + (i * 97) % 3000 if i % 2 == 0 else 3600 * (2 + (i * 53) % 20) + i
        jobs.append(Ended("a", "resize", status, ago, 0.004 * 1.17**i))
    # cancelled before they started: ended, but no run
    jobs += [Ended("a", "resize", "cancelled", 600 + i, None) for i in range(2)]
    # outside the day: 30 h ago (still in the rollup), 3 days ago (not in it)
    jobs += [Ended("a", "resize", "succeeded", 30 * 3600, 1.0)]
    jobs += [Ended("a", "resize", "failed", 3 * 86400, 1.0)]
    # another org and another type
    jobs += [Ended("b", "resize", "failed", 300 + i, 100.0) for i in range(5)]
    jobs += [Ended("a", "mail", "succeeded", 900 + i, 0.5) for i in range(3)]
    return jobs


HOT = [Ended("a", "resize", "succeeded", 5 + i, 0.2) for i in range(3)]


def _minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def expected(jobs: list[Ended], now: datetime, minutes: int) -> Window:
    """The window as the pages define it: this UTC minute and the ``minutes - 1`` before."""
    first = _minute(now) - timedelta(minutes=minutes - 1)
    window = Window(minutes)
    for job in jobs:
        if _minute(now - timedelta(seconds=job.ago_s)) < first:
            continue
        setattr(window, job.status, getattr(window, job.status) + 1)
        if job.run_s is not None:
            window.run_s += job.run_s
    return window


def exact_quantile(jobs: list[Ended], now: datetime, minutes: int, q: float) -> float:
    """The nearest-rank ``q`` quantile of the runs in the window."""
    first = _minute(now) - timedelta(minutes=minutes - 1)
    runs = sorted(
        j.run_s
        for j in jobs
        if j.run_s is not None and _minute(now - timedelta(seconds=j.ago_s)) >= first
    )
    return runs[math.ceil(q * len(runs)) - 1]


def bucket_of(conn: Conn, run_s: float) -> int:
    row = conn.execute(
        "SELECT jobsd.type_stats_bucket(now(), now() + make_interval(secs => %s))", (run_s,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def assert_within_one_bucket(conn: Conn, estimate: float | None, exact: float) -> None:
    assert estimate is not None
    bucket = bucket_of(conn, exact)
    low = bucket_bounds(max(bucket - 1, 0))[0]
    high = bucket_bounds(min(bucket + 1, 63))[1]
    assert low <= estimate <= high, (estimate, exact, bucket)


def assert_counts(got: Window, want: Window) -> None:
    assert (got.succeeded, got.failed, got.cancelled) == (
        want.succeeded,
        want.failed,
        want.cancelled,
    )
    assert got.run_s == pytest.approx(want.run_s)


def by_type(found: list[TypeStats]) -> dict[str, TypeStats]:
    return {s.type: s for s in found}


@pytest.fixture
def now(conn: Conn) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


def archive_all(conn: Conn, min_age_s: float) -> int:
    row = conn.execute("SELECT jobsd.archive_move(10000, %s)", (min_age_s,)).fetchone()
    assert row is not None
    return int(row[0])


async def test_figures_count_each_job_once_with_percentiles_within_a_bucket(
    conn: Conn, aconn: AConn, now: datetime
) -> None:
    jobs = spread()
    for job in jobs:
        make_ended(conn, now, job)
    hot = [make_ended(conn, now, job) for job in HOT]
    assert archive_all(conn, 60) == len(jobs)
    left = conn.execute("SELECT id FROM jobsd.jobs ORDER BY id").fetchall()
    assert sorted(r[0] for r in left) == sorted(hot), "the hot jobs are not archived yet"

    org_a = Caller.for_org("a", "tests")
    found = by_type(await read_type_stats(aconn, org_a, now=now))
    assert list(found) == ["mail", "resize"]
    resize = found["resize"]
    mine = [j for j in [*jobs, *HOT] if j.org == "a" and j.type == "resize"]
    for got, minutes in ((resize.hour, 60), (resize.day, 1440)):
        assert_counts(got, expected(mine, now, minutes))
        assert got.failure_rate == pytest.approx(got.failed / got.finished)
        assert_within_one_bucket(conn, got.p50_s, exact_quantile(mine, now, minutes, 0.5))
        assert_within_one_bucket(conn, got.p95_s, exact_quantile(mine, now, minutes, 0.95))
    # the jobs that never ran are ended (and counted), with no duration
    assert resize.hour.histogram[-1] == 2
    assert resize.hour.runs == resize.hour.finished - 2
    assert resize.hour.per_minute == resize.hour.finished / 60
    assert resize.day.per_hour == resize.day.finished / 24
    # the chart: the minutes of the hour add up to its succeeded and failed
    assert sum(ok for ok, _ in resize.minutes.values()) == resize.hour.succeeded
    assert sum(bad for _, bad in resize.minutes.values()) == resize.hour.failed
    # the hot jobs ended 5-7 s ago, all the others 2 minutes ago or more
    assert sum(resize.minutes.get(m, (0, 0))[0] for m in (0, 1)) == len(HOT)
    assert all(0 <= m < 60 for m in resize.minutes)

    # once they are archived too, nothing changes: counted in one place or the other
    assert archive_all(conn, 0) == len(HOT)
    again = by_type(await read_type_stats(aconn, org_a, now=now))
    assert list(again) == list(found)
    for name, stats in again.items():
        assert stats.minutes == found[name].minutes
        for got, was in ((stats.hour, found[name].hour), (stats.day, found[name].day)):
            assert got.histogram == was.histogram
            assert_counts(got, was)


async def test_figures_are_scoped_by_org_and_filtered_by_type(
    conn: Conn, aconn: AConn, now: datetime
) -> None:
    jobs = spread()
    for job in jobs:
        make_ended(conn, now, job)
    archive_all(conn, 0)
    b_resize = [j for j in jobs if j.org == "b"]

    org_b = Caller.for_org("b", "tests")
    found = by_type(await read_type_stats(aconn, org_b, now=now))
    assert list(found) == ["resize"]
    assert_counts(found["resize"].day, expected(b_resize, now, 1440))
    assert found["resize"].day.p50_s == pytest.approx(100.0, rel=0.42)
    # an org asking for another org's figures sees none, as in the jobs list
    assert await read_type_stats(aconn, org_b, org_id="a", now=now) == []
    assert await read_type_stats(aconn, org_b, org_id="b", now=now) != []

    every = by_type(await read_type_stats(aconn, OPERATOR, now=now))
    both = [j for j in jobs if j.type == "resize"]
    assert_counts(every["resize"].day, expected(both, now, 1440))
    narrowed = await read_type_stats(aconn, OPERATOR, org_id="b", type="resize", now=now)
    assert [s.type for s in narrowed] == ["resize"]
    assert_counts(narrowed[0].hour, expected(b_resize, now, 60))
    mail = await read_type_stats(aconn, OPERATOR, type="mail", now=now)
    assert [s.type for s in mail] == ["mail"] and mail[0].day.succeeded == 3
    assert await read_type_stats(aconn, OPERATOR, type="nothing", now=now) == []


def test_the_rollup_keeps_two_days_and_moves_in_order(conn: Conn, now: datetime) -> None:
    conn.execute(
        "INSERT INTO jobsd.type_stats VALUES ('hour', now() - interval '3 days', 'a', 'default',"
        " 'old', 5, 1, 0, 0, 0.01)"
    )
    make_ended(conn, now, Ended("a", "t", "succeeded", 3 * 86400, 1.0))
    make_ended(conn, now, Ended("a", "t", "succeeded", 86400, 1.0))
    assert archive_all(conn, 0) == 2
    rows = conn.execute(
        "SELECT period, type, succeeded FROM jobsd.type_stats ORDER BY period"
    ).fetchall()
    # the 3-day-old job is archived but not counted; the stale row is gone
    assert rows == [("hour", "t", 1), ("minute", "t", 1)]
    every_org = conn.execute(
        "SELECT period, type, succeeded FROM jobsd.type_stats_all_orgs ORDER BY period"
    ).fetchall()
    assert every_org == rows
    row = conn.execute("SELECT count(*) FROM jobsd.jobs_archive").fetchone()
    assert row == (2,)


async def test_the_migration_counts_what_the_archive_holds(empty_db_url: str) -> None:
    migrate_sync(empty_db_url, up_to=27)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        before = row[0]
        for job in spread():
            make_ended(conn, before, job)
        archive_all(conn, 0)  # the move of 0027: no rollup yet
    migrate_sync(empty_db_url)
    async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as aconn:
        found = by_type(await read_type_stats(aconn, Caller.for_org("a", "t"), now=before))
    mine = [j for j in spread() if j.org == "a" and j.type == "resize"]
    assert_counts(found["resize"].day, expected(mine, before, 1440))
    assert_counts(found["resize"].hour, expected(mine, before, 60))
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        # nothing beyond the 2 days the rollup keeps (the 3-day-old job)
        row = conn.execute(
            "SELECT count(*) FROM jobsd.type_stats WHERE start_at < now() - interval '2 days'"
        ).fetchone()
        assert row == (0,)
        # every org's sums are the orgs' rows added up
        row = conn.execute(
            "SELECT (SELECT sum(succeeded + failed + cancelled) FROM jobsd.type_stats),"
            " (SELECT sum(succeeded + failed + cancelled) FROM jobsd.type_stats_all_orgs)"
        ).fetchone()
        assert row is not None and row[0] == row[1] and row[0] > 0
    async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as aconn:
        every = by_type(await read_type_stats(aconn, OPERATOR, now=before))
    assert_counts(
        every["resize"].day, expected([j for j in spread() if j.type == "resize"], before, 1440)
    )


def test_two_moves_at_once_count_every_job_once(db_url: str, conn: Conn, now: datetime) -> None:
    """A second move counting into the same rows waits for the first (no deadlock, no
    lost update): its jobs are others (SKIP LOCKED), its keys the same."""
    import threading

    for i in range(40):
        make_ended(conn, now, Ended(f"o{i % 4}", f"t{i % 3}", "succeeded", 120 + i % 5, 0.05))
    first = psycopg.connect(db_url)
    second = psycopg.connect(db_url)
    try:
        moved_first = first.execute("SELECT jobsd.archive_move(20, 0)").fetchone()
        assert moved_first == (20,)
        moved: list[Any] = []
        other = threading.Thread(
            target=lambda: moved.append(
                second.execute("SELECT jobsd.archive_move(100, 0)").fetchone()
            )
        )
        other.start()
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
        )
        deadline = time.monotonic() + 10
        while conn.execute(waiting, (second.info.backend_pid,)).fetchone() != (1,):
            assert time.monotonic() < deadline, "the second move never waited"
            assert other.is_alive(), "the second move did not wait for the first's rows"
            time.sleep(0.01)
        first.commit()
        other.join(10)
        assert not other.is_alive() and moved == [(20,)]
        second.commit()
    finally:
        first.close()
        second.close()
    row = conn.execute(
        "SELECT sum(succeeded) FILTER (WHERE period = 'minute'),"
        " sum(succeeded) FILTER (WHERE period = 'hour'), count(DISTINCT (org_id, type))"
        " FROM jobsd.type_stats"
    ).fetchone()
    assert row == (40, 40, 12)
    row = conn.execute(
        "SELECT sum(succeeded) FILTER (WHERE period = 'minute'),"
        " sum(succeeded) FILTER (WHERE period = 'hour'), count(DISTINCT type)"
        " FROM jobsd.type_stats_all_orgs"
    ).fetchone()
    assert row == (40, 40, 3)
