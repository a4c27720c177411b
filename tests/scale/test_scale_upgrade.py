"""An upgraded database of a million ended jobs moves into the archive while it works.

The migration to the hot table and archive only creates empty objects; the daemons
then move the backlog batch by batch. Meanwhile enqueues and claims go on, and at the
end every job and every history row is still there, once.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import psycopg
import pytest
from support.daemon import fast_settings, running_daemon
from support.waiting import wait_until

import jobsd
from jobsd.registry import Registry
from jobsd.store.migrate import migrate_sync

pytestmark = pytest.mark.anyio

BACKLOG = 1_000_000
SINGLE_TABLE_VERSION = 26

FILL = [
    # no triggers: the history is written below
    "SET session_replication_role = replica",
    """
INSERT INTO jobsd.jobs (id, org_id, type, queue, status, attempts, payload, run_after,
                        created_at, started_at, finished_at, error)
SELECT gen_random_uuid(), 'org' || (i %% 5), 'type' || (i %% 7), 'default',
       CASE WHEN i %% 20 = 0 THEN 'failed' ELSE 'succeeded' END, 1,
       jsonb_build_object('n', i), t, t, t, t + interval '2 seconds',
       CASE WHEN i %% 20 = 0 THEN 'boom' END
FROM generate_series(1, %(jobs)s) AS i,
     LATERAL (SELECT now() - interval '90 days' + i * interval '7 seconds' AS t) AS c""",
    """
INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, at)
SELECT j.id, j.org_id, s.from_status, s.to_status, 1, j.created_at
FROM jobsd.jobs AS j
CROSS JOIN LATERAL (VALUES (NULL, 'queued'), ('queued', 'running'),
                           ('running', j.status)) AS s(from_status, to_status)""",
    "SET session_replication_role = origin",
    "ANALYZE jobsd.jobs",
    "ANALYZE jobsd.job_events",
]

# every job and every history row, as one number each: a job lost, doubled or changed
# on the way changes it
FINGERPRINT = """
SELECT (SELECT count(*) FROM jobsd.{jobs}) AS jobs,
       (SELECT sum(hashtext(id::text || status || finished_at::text)::numeric)
        FROM jobsd.{jobs}) AS jobs_hash,
       (SELECT count(*) FROM jobsd.{events}) AS events,
       (SELECT sum(hashtext(job_id::text || id::text || to_status)::numeric)
        FROM jobsd.{events}) AS events_hash
"""


def fingerprint(conn: psycopg.Connection[Any], jobs: str, events: str) -> tuple[Any, ...]:
    row = conn.execute(FINGERPRINT.format(jobs=jobs, events=events)).fetchone()
    assert row is not None
    return tuple(row)


def old_backlog_left(conn: psycopg.Connection[Any]) -> bool:
    """Say whether a job of the old backlog (all ended days ago) is still hot."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM jobsd.jobs WHERE finished_at < now() - interval '1 day')"
    ).fetchone()
    return bool(row[0])  # type: ignore[index]


@pytest.mark.timeout(1200)
async def test_a_million_ended_jobs_move_online_and_nothing_is_lost(
    empty_db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    migrate_sync(empty_db_url, up_to=SINGLE_TABLE_VERSION)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        for statement in FILL:
            conn.execute(statement, {"jobs": BACKLOG} if "%(jobs)s" in statement else None)
        before = fingerprint(conn, "jobs", "job_events")
        assert before[0] == BACKLOG and before[2] == 3 * BACKLOG

        started = time.monotonic()
        applied = migrate_sync(empty_db_url)
        migration_s = time.monotonic() - started
        assert applied[0] == "0027_archive", applied
        # the migrations touch no job: they take no time whatever the table holds
        assert migration_s < 10, migration_s
        assert fingerprint(conn, "all_jobs", "all_job_events") == before

        registry = Registry()
        done: list[float] = []

        @jobsd.handler("live", registry=registry)
        async def live(ctx: jobsd.JobContext) -> None:
            done.append(time.monotonic())

        settings = fast_settings(
            empty_db_url, archive_after=1.0, archive_interval=0.2, archive_batch=5000
        )
        enqueue_s: list[float] = []
        live_ids: list[Any] = []
        during: dict[str, int] = {}
        async with (
            jobsd.Client(empty_db_url) as client,
            running_daemon(settings, registry),
        ):
            move_started = time.monotonic()
            while True:
                t0 = time.monotonic()
                job = await client.enqueue("live", {"n": len(live_ids)}, org_id="live")
                enqueue_s.append(time.monotonic() - t0)
                live_ids.append(job.id)
                left = await anyio.to_thread.run_sync(old_backlog_left, conn)
                if not left or time.monotonic() - move_started > 900:
                    break
                # what ran while the old backlog was still being moved
                during["completed"] = len(done)
                during["enqueued"] = len(live_ids)
                await anyio.sleep(0.05)
            moved_s = time.monotonic() - move_started

            async def all_live_done() -> bool:
                return len(done) >= len(live_ids)

            await wait_until(all_live_done, what="the live jobs done", timeout_s=60)

        refused = [r.__dict__ for r in caplog.records if r.message == "archive.refused"]
        assert refused == [], [(r.get("cause"), r.get("error")) for r in refused]
        # enqueues and claims went on while the backlog moved
        assert during.get("completed", 0) >= 10, (during, moved_s)
        assert max(enqueue_s) < 5.0, max(enqueue_s)
        # every old job and event is there once, in the archive, unchanged
        with conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = on")
            old_archived = conn.execute(
                "SELECT count(*) FROM jobsd.jobs_archive WHERE org_id <> 'live'"
            ).fetchone()[0]
        assert old_archived == BACKLOG
        total = fingerprint(conn, "all_jobs", "all_job_events")
        assert total[0] == BACKLOG + len(live_ids)
        hot_old = conn.execute("SELECT count(*) FROM jobsd.jobs WHERE org_id <> 'live'").fetchone()[
            0
        ]
        assert hot_old == 0
        old_only = conn.execute(
            FINGERPRINT.format(jobs="jobs_archive", events="job_events_archive")
            .replace("FROM jobsd.jobs_archive)", "FROM jobsd.jobs_archive WHERE org_id <> 'live')")
            .replace(
                "FROM jobsd.job_events_archive)",
                "FROM jobsd.job_events_archive WHERE org_id <> 'live')",
            )
        ).fetchone()
        assert tuple(old_only) == before  # type: ignore[arg-type]
        print(
            f"migration {migration_s:.2f} s; backlog of {BACKLOG} moved in {moved_s:.0f} s;"
            f" {during.get('completed', 0)} live jobs completed meanwhile;"
            f" enqueue max {max(enqueue_s) * 1000:.0f} ms"
        )
