"""``jobsd.admin.retention.prune``: what goes, what stays, batches, dry runs, bad input, locks."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest
from prunekit import (
    NON_TERMINAL,
    TERMINAL,
    event_counts,
    job_ids,
    make_job,
    set_retention,
    v7_at,
)
from psycopg import sql

from jobsd.admin.retention import PruneReport, prune
from jobsd.errors import ConfigError
from jobsd.store.db import make_async_pool

pytestmark = pytest.mark.anyio

Conn = psycopg.Connection[Any]
AConn = psycopg.AsyncConnection[Any]


@pytest.fixture
def now() -> datetime:
    """The pinned clock of a test: jobs are made relative to it, prunes measure from it."""
    return datetime.now(UTC).replace(microsecond=0)


async def _prune(aconn: AConn, now: datetime, **kw: Any) -> PruneReport:
    return await prune(aconn, now=now, **kw)


async def test_only_terminal_jobs_older_than_the_queue_policy_go(
    conn: Conn, aconn: AConn, now: datetime
) -> None:
    set_retention(conn, "default", 30)
    gone = {make_job(conn, now, status=s, days=31) for s in TERMINAL}
    gone.add(make_job(conn, now, status="succeeded", days=30 + 1 / 86400))  # one second over
    young = {make_job(conn, now, status=s, days=29) for s in TERMINAL}
    young.add(make_job(conn, now, status="failed", days=30))  # exactly at the cutoff
    # every other state, however old, and even with a finished_at
    live = {make_job(conn, now, status=s, days=400) for s in NON_TERMINAL}

    report = await _prune(aconn, now)

    assert job_ids(conn) == young | live
    assert report.deleted == {"default": len(gone)}
    assert report.total == 4 and not report.dry_run
    assert report.queue_retention == {"default": 30}
    assert report.now == now


async def test_queues_without_retention_keep_everything(
    conn: Conn, aconn: AConn, now: datetime
) -> None:
    set_retention(conn, "keep", None)
    set_retention(conn, "short", 1)
    kept = {make_job(conn, now, queue=q, days=3650) for q in ("default", "keep")}
    gone = make_job(conn, now, queue="short", days=2)

    report = await _prune(aconn, now)

    assert job_ids(conn) == kept
    assert gone not in job_ids(conn)
    assert report.deleted == {"default": 0, "keep": 0, "short": 1}
    assert report.queue_retention == {"default": None, "keep": None, "short": 1}


async def test_no_policy_at_all_reads_nothing(conn: Conn, aconn: AConn, now: datetime) -> None:
    kept = {make_job(conn, now, status=s, days=3650) for s in TERMINAL}

    report = await _prune(aconn, now)

    assert job_ids(conn) == kept
    assert (report.total, report.batches, report.scanned) == (0, 0, 0)


async def test_spared_types_stay_whatever_the_policies(
    conn: Conn, aconn: AConn, now: datetime
) -> None:
    set_retention(conn, "default", 1)
    set_retention(conn, "keep", None)
    spared = {
        make_job(conn, now, type="audit", days=100),
        make_job(conn, now, type="ledger", days=100),
        make_job(conn, now, type="audit", queue="keep", days=100),
    }
    gone = make_job(conn, now, type="mail", days=100)
    recent = make_job(conn, now, type="audit", days=0.01)

    # a type retention for a spared type does not apply either: spared wins
    report = await _prune(
        aconn, now, spare_types=["audit", "ledger"], type_retention={"audit": 0, "mail": 7}
    )

    assert job_ids(conn) == spared | {recent}
    assert gone not in job_ids(conn)
    assert report.spare_types == ("audit", "ledger")
    assert report.total == 1
    # nor does it move the newest cutoff: ids younger than a day are not even read
    assert report.scanned == 4


async def test_type_retention_overrides_the_queue_policy(
    conn: Conn, aconn: AConn, now: datetime
) -> None:
    set_retention(conn, "default", 30)
    set_retention(conn, "keep", None)
    shorter = make_job(conn, now, type="report", days=10)  # type: 7 days < 10
    plain = make_job(conn, now, type="mail", days=10)  # queue: 30 days > 10
    longer = make_job(conn, now, type="invoice", days=100)  # type: 365 days > 100
    plain_old = make_job(conn, now, type="mail", days=31)  # queue: 30 days < 31
    # a type policy applies in a queue that keeps jobs forever too
    in_keep = make_job(conn, now, type="report", queue="keep", days=8)
    kept_in_keep = make_job(conn, now, type="mail", queue="keep", days=3650)
    recent_report = make_job(conn, now, type="report", days=6)

    report = await _prune(aconn, now, type_retention={"report": 7, "invoice": 365})

    assert job_ids(conn) == {plain, longer, kept_in_keep, recent_report}
    assert {shorter, plain_old, in_keep}.isdisjoint(job_ids(conn))
    assert report.deleted == {"default": 2, "keep": 1}
    assert report.type_retention == {"report": 7, "invoice": 365}


async def test_history_and_dependency_edges_go_with_their_jobs(
    conn: Conn, aconn: AConn, now: datetime
) -> None:
    set_retention(conn, "default", 30)
    old = make_job(conn, now, days=40)
    old_dependent = make_job(conn, now, days=35)
    kept = make_job(conn, now, days=1)
    blocked = make_job(conn, now, status="blocked", days=400)
    conn.execute(
        "INSERT INTO jobsd.job_dependencies (job_id, depends_on, org_id)"
        " VALUES (%s, %s, 'o'), (%s, %s, 'o'), (%s, %s, 'o')",
        (kept, old, old_dependent, kept, blocked, kept),
    )
    before = event_counts(conn)
    assert before[old] == 3 and before[kept] == 3  # queued, running, succeeded

    report = await _prune(aconn, now)

    assert report.total == 2
    after = event_counts(conn)
    assert old not in after and old_dependent not in after
    assert after[kept] == before[kept] and after[blocked] == before[blocked]
    edges = conn.execute("SELECT job_id, depends_on FROM jobsd.job_dependencies").fetchall()
    assert edges == [(blocked, kept)]


async def test_dry_run_deletes_nothing_and_counts_what_a_prune_deletes(
    conn: Conn, aconn: AConn, now: datetime
) -> None:
    set_retention(conn, "default", 30)
    set_retention(conn, "mail", 7)
    for i in range(5):
        make_job(conn, now, days=31 + i)
        make_job(conn, now, queue="mail", days=8 + i)
        make_job(conn, now, queue="mail", status="running", days=100)
    make_job(conn, now, type="report", days=3)
    make_job(conn, now, days=29)
    jobs, events = job_ids(conn), event_counts(conn)

    dry = await _prune(aconn, now, type_retention={"report": 2}, batch_size=3, dry_run=True)

    assert dry.dry_run
    assert (job_ids(conn), event_counts(conn)) == (jobs, events)
    assert dry.deleted == {"default": 6, "mail": 5}

    real = await _prune(aconn, now, type_retention={"report": 2}, batch_size=3)

    assert real.deleted == dry.deleted
    assert len(job_ids(conn)) == len(jobs) - dry.total


async def test_batches_smaller_than_the_candidates_delete_them_all(
    conn: Conn, aconn: AConn, now: datetime
) -> None:
    set_retention(conn, "default", 30)
    # due jobs interleaved in id order with survivors of every kind
    kept: set[uuid.UUID] = set()
    for i in range(12):
        make_job(conn, now, days=200 - i)
        kept.add(make_job(conn, now, status=NON_TERMINAL[i % 5], days=199.5 - i))
        kept.add(make_job(conn, now, type="audit", days=199.2 - i))

    report = await _prune(aconn, now, batch_size=2, spare_types=["audit"])

    assert job_ids(conn) == kept
    assert report.total == 12
    # one pass: 36 old rows read 2 at a time, each read once
    assert report.scanned == 36
    # 18 full batches, one that finds the end, one for the ids above now
    assert report.batches == 20

    again = await _prune(aconn, now, batch_size=2, spare_types=["audit"])
    assert again.total == 0 and job_ids(conn) == kept


async def test_jobs_with_ids_out_of_time_order_are_found(
    conn: Conn, aconn: AConn, now: datetime
) -> None:
    """Client-chosen ids (any UUID) sort anywhere: the walk covers all but recent v7 ids."""
    set_retention(conn, "default", 30)
    edge_ids = [
        uuid.UUID(int=0),
        uuid.UUID(int=(1 << 128) - 1),
        uuid.UUID("8d6c1f0e-5a4b-4c3d-9e2f-1a2b3c4d5e6f"),  # a UUIDv4
        uuid.UUID("ffffffff-0000-4000-8000-000000000000"),
    ]
    for job_id in edge_ids:
        make_job(conn, now, days=40, job_id=job_id)
    kept = make_job(conn, now, days=20, job_id=uuid.UUID("fffffffe-0000-4000-8000-000000000000"))

    report = await _prune(aconn, now)

    assert job_ids(conn) == {kept}
    assert report.total == len(edge_ids)


async def test_recent_ids_are_skipped_unless_full_scan(
    conn: Conn, aconn: AConn, now: datetime
) -> None:
    """A job created (by its id) after the newest cutoff cannot be due and is not read;
    one whose id is younger than its finished_at (imported, say) goes with full_scan."""
    set_retention(conn, "default", 30)
    old = make_job(conn, now, days=40)
    imported = make_job(conn, now, days=40, job_id=v7_at(now - timedelta(days=2)))
    recent = make_job(conn, now, days=2)

    first = await _prune(aconn, now)

    assert first.total == 1 and job_ids(conn) == {imported, recent}
    assert first.scanned == 1, "the two recent ids are not read"

    full = await _prune(aconn, now, full_scan=True)

    assert full.total == 1 and job_ids(conn) == {recent}
    assert full.scanned == 2
    assert old not in event_counts(conn) and imported not in event_counts(conn)


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        ({"type_retention": {"report": -1}}, "'report' must be a whole number of days >= 0"),
        ({"type_retention": {"report": 1.5}}, "whole number of days"),
        ({"type_retention": {"report": True}}, "whole number of days"),
        ({"type_retention": {"": 3}}, "non-empty type name"),
        ({"spare_types": "audit"}, "not one string"),
        ({"spare_types": [""]}, "non-empty name"),
        ({"batch_size": 0}, "between 1 and"),
        ({"batch_size": 10**9}, "between 1 and"),
        ({"now": datetime(2030, 1, 1)}, "timezone-aware"),
    ],
)
async def test_bad_input_is_refused_before_anything_is_deleted(
    conn: Conn, aconn: AConn, now: datetime, kw: dict[str, Any], fragment: str
) -> None:
    set_retention(conn, "default", 1)
    jobs = {make_job(conn, now, days=10)}
    args: dict[str, Any] = {"now": now, **kw}

    with pytest.raises(ConfigError, match=fragment):
        await prune(aconn, **args)

    assert job_ids(conn) == jobs


async def test_a_connection_in_a_transaction_is_refused(
    conn: Conn, aconn: AConn, now: datetime
) -> None:
    set_retention(conn, "default", 1)
    jobs = {make_job(conn, now, days=10)}
    async with aconn.transaction():
        with pytest.raises(ConfigError, match="outside a transaction"):
            await _prune(aconn, now)
    assert job_ids(conn) == jobs


async def test_a_role_under_row_level_security_is_refused(
    conn: Conn, aconn: AConn, now: datetime
) -> None:
    """A role limited to one org would see (and count) that org's jobs only."""
    set_retention(conn, "default", 1)
    jobs = {make_job(conn, now, days=10)}
    role = f"prune_rls_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    try:
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA jobsd TO {}").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("GRANT SELECT, DELETE ON ALL TABLES IN SCHEMA jobsd TO {}").format(
                sql.Identifier(role)
            )
        )
        await aconn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        with pytest.raises(ConfigError, match="row-level security"):
            await _prune(aconn, now, dry_run=True)
        await aconn.execute("RESET ROLE")
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    assert job_ids(conn) == jobs


async def test_a_locked_job_is_skipped_without_waiting_and_taken_next_time(
    conn: Conn, aconn: AConn, now: datetime, db_url: str
) -> None:
    """A row held by another session (here: the lock a foreign-key check of an insert
    takes) is left alone instead of waited for."""
    set_retention(conn, "default", 1)
    held = make_job(conn, now, days=10)
    free = make_job(conn, now, days=11)
    with psycopg.connect(db_url) as other:
        other.execute("SELECT 1 FROM jobsd.jobs WHERE id = %s FOR KEY SHARE", (held,))
        with anyio.fail_after(10):
            first = await _prune(aconn, now)
        assert first.total == 1
        assert job_ids(conn) == {held}
        other.rollback()
    second = await _prune(aconn, now)
    assert second.total == 1
    assert job_ids(conn) == set()
    assert free not in event_counts(conn) and held not in event_counts(conn)


async def test_concurrent_prunes_delete_each_job_once(
    conn: Conn, aconn: AConn, now: datetime, db_url: str
) -> None:
    set_retention(conn, "default", 1)
    kept = {make_job(conn, now, status="queued", days=50 + i) for i in range(10)}
    for i in range(60):
        make_job(conn, now, days=2 + i / 10)
    reports: list[PruneReport] = []

    async def one() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            reports.append(await prune(c, now=now, batch_size=3))

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(one)

    assert sum(r.total for r in reports) == 60
    assert job_ids(conn) == kept


async def test_a_pool_works_as_well_as_a_connection(conn: Conn, db_url: str, now: datetime) -> None:
    set_retention(conn, "default", 1)
    make_job(conn, now, days=5)
    pool = make_async_pool(db_url, name="prune-test", min_size=1, max_size=1, timeout_s=10)
    async with pool:
        report = await prune(pool, now=now)
    assert report.total == 1 and job_ids(conn) == set()


async def test_a_connection_without_autocommit_commits_each_batch(
    conn: Conn, db_url: str, now: datetime
) -> None:
    set_retention(conn, "default", 1)
    for i in range(3):
        make_job(conn, now, days=5 + i)
    async with await psycopg.AsyncConnection.connect(db_url) as manual:
        report = await prune(manual, now=now, batch_size=2)
        assert manual.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert report.total == 3 and job_ids(conn) == set()


async def test_the_database_clock_is_used_by_default(conn: Conn, aconn: AConn) -> None:
    real_now = datetime.now(UTC)
    set_retention(conn, "default", 1)
    make_job(conn, real_now, days=1.01)
    kept = make_job(conn, real_now, days=0.99)

    report = await prune(aconn)

    assert job_ids(conn) == {kept}
    assert abs(report.now - real_now) < timedelta(minutes=1)
