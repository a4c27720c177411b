"""The hot table and the archive: ended jobs move with their history, every read finds
them, enqueue and retry behave the same, months are made ahead and dropped whole."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.retention import make_old_job, set_retention

from jobsd import SyncClient
from jobsd.admin.retention import prune
from jobsd.errors import DuplicateJob, UnknownDependency
from jobsd.store.connect import make_async_pool
from jobsd.worker.archiver import Archiver, ArchiverSettings
from jobsd.worker.clock import SYSTEM_CLOCK
from jobsd.worker.stats import DaemonStats

pytestmark = pytest.mark.anyio

Conn = psycopg.Connection[Any]
TERMINAL = ("succeeded", "failed", "cancelled")


def archive_all(conn: Conn) -> int:
    """Move every ended job into the archive, whatever its age; return how many."""
    moved = 0
    while True:
        count = conn.execute("SELECT jobsd.archive_move(1000, 0)").fetchone()[0]
        moved += count
        if count < 1000:
            return moved


def where(conn: Conn, job_id: uuid.UUID) -> tuple[int, int, int, int]:
    """Return (hot rows, archived rows, hot events, archived events) of a job: the
    events of its whole history (stored, or derived from its row) on each side."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobsd.jobs WHERE id = %(id)s),"
        " (SELECT count(*) FROM jobsd.jobs_archive WHERE id = %(id)s),"
        " (SELECT count(*) FROM jobsd.all_job_events WHERE job_id = %(id)s"
        "  AND EXISTS (SELECT 1 FROM jobsd.jobs WHERE id = %(id)s)),"
        " (SELECT count(*) FROM jobsd.all_job_events WHERE job_id = %(id)s"
        "  AND EXISTS (SELECT 1 FROM jobsd.jobs_archive WHERE id = %(id)s))",
        {"id": job_id},
    ).fetchone()
    return tuple(int(v) for v in row)  # type: ignore[return-value]


@pytest.fixture
def now(conn: Conn) -> datetime:
    return conn.execute("SELECT now()").fetchone()[0]


def test_ended_jobs_move_with_their_history_and_open_ones_stay(conn: Conn, now: datetime) -> None:
    ended = {s: make_old_job(conn, now, status=s, days=3) for s in TERMINAL}
    recent = make_old_job(conn, now, status="succeeded", days=0)
    open_ = {s: make_old_job(conn, now, status=s, days=3) for s in ("queued", "running")}
    events_before = {j: where(conn, j)[2] for j in [*ended.values(), recent, *open_.values()]}

    moved = conn.execute("SELECT jobsd.archive_move(100, 60)").fetchone()[0]

    assert moved == 3
    for job_id in ended.values():
        assert where(conn, job_id) == (0, 1, 0, events_before[job_id])
    for job_id in [recent, *open_.values()]:
        assert where(conn, job_id) == (1, 0, events_before[job_id], 0)
    contents = conn.execute(
        "SELECT month, queue, type, jobs FROM jobsd.archive_contents"
    ).fetchall()
    month = conn.execute("SELECT jobsd.archive_month(%s)", (now - timedelta(days=3),)).fetchone()[0]
    assert contents == [(month, "default", "t", 3)]
    # nothing more is due: a second batch moves nothing
    assert conn.execute("SELECT jobsd.archive_move(100, 60)").fetchone()[0] == 0


def test_reads_find_an_archived_job_with_its_whole_history(conn: Conn, db_url: str) -> None:
    with SyncClient(db_url) as client:
        job = client.enqueue("t", {"n": 1}, org_id="o")
        conn.execute(
            "UPDATE jobsd.jobs SET status = 'running', lease_id = gen_random_uuid(),"
            " started_at = now(), attempts = 1 WHERE id = %s",
            (job.id,),
        )
        conn.execute(
            "UPDATE jobsd.jobs SET status = 'succeeded', finished_at = now(),"
            " report = '{\"ok\": true}' WHERE id = %s",
            (job.id,),
        )
        before = client.get(job.id, org_id="o")
        history_before = client.events(job.id, org_id="o")
        listed_before = client.list(org_id="o").jobs

        assert archive_all(conn) == 1
        assert where(conn, job.id)[:2] == (0, 1)

        assert client.get(job.id, org_id="o") == before
        assert client.events(job.id, org_id="o") == history_before
        assert [e.to_status for e in history_before] == ["queued", "running", "succeeded"]
        assert client.list(org_id="o").jobs == listed_before
        assert client.list(org_id="o", status="succeeded", type="t").jobs == listed_before
        assert client.wait(job.id, org_id="o", timeout_s=5).status == "succeeded"
        # another org sees nothing of it
        with pytest.raises(LookupError):
            client.get(job.id, org_id="other")


def test_dependencies_on_archived_jobs_behave_as_on_hot_ones(
    conn: Conn, now: datetime, db_url: str
) -> None:
    done = make_old_job(conn, now, status="succeeded", days=2, org_id="o")
    failed = make_old_job(conn, now, status="failed", days=2, org_id="o")
    other_org = make_old_job(conn, now, status="succeeded", days=2, org_id="p")
    assert archive_all(conn) == 3

    with SyncClient(db_url) as client:
        runs = client.enqueue("t", org_id="o", depends_on=[done])
        assert runs.status == "queued"
        fails = client.enqueue("t", org_id="o", depends_on=[done, failed])
        assert fails.status == "failed"
        assert fails.reason == f"dependency {failed} failed"
        with pytest.raises(UnknownDependency):
            client.enqueue("t", org_id="o", depends_on=[other_org])
        with pytest.raises(UnknownDependency):
            client.enqueue("t", org_id="o", depends_on=[uuid.uuid4()])
    edges = conn.execute(
        "SELECT job_id, depends_on FROM jobsd.job_dependencies ORDER BY job_id, depends_on"
    ).fetchall()
    assert sorted(edges) == sorted([(runs.id, done), (fails.id, done), (fails.id, failed)])


def test_an_id_given_again_finds_its_archived_job(conn: Conn, now: datetime, db_url: str) -> None:
    with SyncClient(db_url) as client:
        first = client.enqueue("t", org_id="o", job_id=uuid.uuid4())
        conn.execute(
            "UPDATE jobsd.jobs SET status = 'cancelled', finished_at = now() WHERE id = %s",
            (first.id,),
        )
        assert archive_all(conn) == 1
        again = client.enqueue("t", org_id="o", job_id=first.id)
        assert again.id == first.id and again.status == "cancelled"
        with pytest.raises(DuplicateJob):
            client.enqueue("t", org_id="p", job_id=first.id)
    assert where(conn, first.id)[:2] == (0, 1)


def test_retry_of_an_archived_job_makes_one_new_job(conn: Conn, now: datetime, db_url: str) -> None:
    failed = make_old_job(conn, now, status="failed", days=1, org_id="o")
    assert archive_all(conn) == 1
    with SyncClient(db_url) as client:
        retried = client.retry(failed, org_id="o")
        assert retried.status == "queued" and retried.id != failed
        assert client.retry(failed, org_id="o").id == retried.id
        assert client.get(failed, org_id="o").retried_as == retried.id
        notes = [e.reason for e in client.events(failed, org_id="o")]
        assert notes[-1] == f"retried as {retried.id}"
        # the retry itself ends and is archived: the original still has one retry
        conn.execute(
            "UPDATE jobsd.jobs SET status = 'cancelled', finished_at = now() WHERE id = %s",
            (retried.id,),
        )
        assert archive_all(conn) == 1
        assert client.retry(failed, org_id="o").id == retried.id
        assert client.get(failed, org_id="o").retried_as == retried.id
    assert where(conn, failed)[:2] == (0, 1)


async def test_the_daemons_archiver_makes_months_ahead_and_survives_a_refused_month(
    conn: Conn, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    now = conn.execute("SELECT now()").fetchone()[0]
    # the month of a job that ended a year ago has no partition, and a table sits in
    # the way of the one the move would make
    ended = make_old_job(conn, now, status="succeeded", days=365)
    month = conn.execute(
        "SELECT jobsd.archive_month(finished_at) FROM jobsd.jobs WHERE id = %s", (ended,)
    ).fetchone()[0]
    blocker = f"jobs_archive_p{month:%Y_%m}"
    conn.execute(f"CREATE TABLE jobsd.{blocker} (x int)")
    stats = DaemonStats()
    pool = make_async_pool(db_url, name="archive-test", min_size=1, max_size=1, timeout_s=5.0)
    await pool.open(wait=True)
    try:
        settings = ArchiverSettings(archive_after_s=1.0, interval_s=1.0, batch=100)
        archiver = Archiver(pool, settings, SYSTEM_CLOCK, stats)
        with caplog.at_level(logging.ERROR, logger="jobsd.worker.archiver"):
            assert await archiver.run_once() == 0
        assert stats.archive_refused == 1
        assert any(r.message == "archive.refused" for r in caplog.records)
        # nothing lost: the job is where it was, and reads find it
        assert where(conn, ended)[:2] == (1, 0)
        # the months ahead were made all the same, in their own statement
        ahead = conn.execute(
            "SELECT count(*) FROM jobsd.archive_months()"
            " WHERE month BETWEEN jobsd.archive_month(now())"
            " AND jobsd.archive_month(now() + interval '2 months')"
        ).fetchone()[0]
        assert ahead == 3
        conn.execute(f"DROP TABLE jobsd.{blocker}")
        assert await archiver.run_once() == 1
    finally:
        await pool.close()
    assert stats.archived == 1
    assert where(conn, ended)[:2] == (0, 1)


async def test_prune_drops_whole_months_and_deletes_the_rest_row_by_row(
    conn: Conn, aconn: psycopg.AsyncConnection[Any], now: datetime
) -> None:
    set_retention(conn, "default", 30)
    old = [make_old_job(conn, now, days=d) for d in (200, 201, 202)]  # one old month
    spared = make_old_job(conn, now, days=170, type="audit")
    beside = make_old_job(conn, now, days=170)  # in the spared job's month
    recent = make_old_job(conn, now, days=5)
    dependent = make_old_job(conn, now, days=5)
    conn.execute(
        "INSERT INTO jobsd.job_dependencies (job_id, depends_on, org_id) VALUES (%s, %s, 'o')",
        (dependent, old[0]),
    )
    assert archive_all(conn) == 7
    old_month = conn.execute(
        "SELECT jobsd.archive_month(finished_at) FROM jobsd.jobs_archive WHERE id = %s",
        (old[0],),
    ).fetchone()[0]
    partition = f"jobsd.jobs_archive_p{old_month:%Y_%m}"

    dry = await prune(aconn, spare_types=["audit"], dry_run=True, now=now)
    assert dry.deleted == {"default": 4} and dry.months_dropped == (old_month,)
    assert conn.execute("SELECT to_regclass(%s)", (partition,)).fetchone()[0] is not None

    report = await prune(aconn, spare_types=["audit"], now=now)

    assert report.deleted == {"default": 4}
    assert report.months_dropped == (old_month,)
    assert conn.execute("SELECT to_regclass(%s)", (partition,)).fetchone()[0] is None
    left = {r[0] for r in conn.execute("SELECT id FROM jobsd.all_jobs").fetchall()}
    assert left == {spared, recent, dependent}
    events_of_gone = conn.execute(
        "SELECT count(*) FROM jobsd.all_job_events WHERE job_id = ANY(%s)", ([*old, beside],)
    ).fetchone()[0]
    assert events_of_gone == 0
    # the edge to a dropped job went with it
    assert conn.execute("SELECT count(*) FROM jobsd.job_dependencies").fetchone()[0] == 0
    # a second prune finds nothing more
    assert (await prune(aconn, spare_types=["audit"], now=now)).total == 0


async def test_the_default_retention_applies_to_queues_without_one(
    conn: Conn, aconn: psycopg.AsyncConnection[Any], now: datetime
) -> None:
    set_retention(conn, "kept", None)
    set_retention(conn, "short", 3)
    jobs = {q: make_old_job(conn, now, days=10, queue=q) for q in ("default", "kept", "short")}
    archive_all(conn)
    assert (await prune(aconn, now=now)).deleted == {"default": 0, "kept": 0, "short": 1}
    report = await prune(aconn, now=now, default_days=7)
    assert report.deleted == {"default": 1, "kept": 1, "short": 0}
    left = {r[0] for r in conn.execute("SELECT id FROM jobsd.all_jobs").fetchall()}
    assert left == set() and jobs


def test_dropping_a_queue_deletes_its_archived_jobs(conn: Conn, now: datetime, db_url: str) -> None:
    set_retention(conn, "gone", None)
    gone = make_old_job(conn, now, days=40, queue="gone")
    kept = make_old_job(conn, now, days=40)
    archive_all(conn)
    dropped = conn.execute("SELECT * FROM jobsd.queue_drop('gone')").fetchone()
    assert dropped == (True, 0, 1)
    assert where(conn, gone) == (0, 0, 0, 0)
    assert where(conn, kept)[:2] == (0, 1)


def test_archive_months_are_utc_months(conn: Conn) -> None:
    conn.execute("SET TIME ZONE 'Pacific/Kiritimati'")
    at = datetime(2027, 3, 31, 23, 30, tzinfo=UTC)
    month = conn.execute("SELECT jobsd.archive_month(%s)", (at,)).fetchone()[0]
    assert month == datetime(2027, 3, 1, tzinfo=UTC)


_STATUSES = st.sampled_from(["queued", "scheduled", "running", *TERMINAL, "recovery_required"])


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    # ages never equal to a move's minimum age: which side of it a job is stays clear
    jobs=st.lists(
        st.tuples(_STATUSES, st.sampled_from([0.5, 3.0, 50.0, 200.0, 399.0])),
        min_size=1,
        max_size=12,
    ),
    batches=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    min_age_days=st.sampled_from([0.0, 1.0, 100.0]),
)
def test_a_move_changes_no_answer(
    conn: Conn, jobs: list[tuple[str, float]], batches: list[int], min_age_days: float
) -> None:
    """Whatever ends where, moves of any size leave every job and history row as it was."""
    conn.execute(
        "TRUNCATE jobsd.jobs, jobsd.job_events, jobsd.jobs_archive,"
        " jobsd.job_events_archive, jobsd.archive_contents"
    )
    now = conn.execute("SELECT now()").fetchone()[0]
    for status, days in jobs:
        make_old_job(conn, now, status=status, days=days)
    read_jobs = "SELECT * FROM jobsd.all_jobs ORDER BY id"
    read_events = "SELECT * FROM jobsd.all_job_events ORDER BY job_id, id"
    before = (conn.execute(read_jobs).fetchall(), conn.execute(read_events).fetchall())
    moved = sum(
        conn.execute("SELECT jobsd.archive_move(%s, %s)", (size, min_age_days * 86400)).fetchone()[
            0
        ]
        for size in batches
    )
    after = (conn.execute(read_jobs).fetchall(), conn.execute(read_events).fetchall())
    assert after == before
    due = sum(1 for s, d in jobs if s in TERMINAL and d > min_age_days)
    assert moved == min(due, sum(batches))
    archived = conn.execute(
        "SELECT count(*) FROM jobsd.jobs_archive WHERE status <> ALL(%s)", (list(TERMINAL),)
    ).fetchone()[0]
    assert archived == 0
    counted = conn.execute("SELECT coalesce(sum(jobs), 0) FROM jobsd.archive_contents")
    assert counted.fetchone()[0] == moved
