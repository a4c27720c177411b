"""The reset before each test: the session's database as the migrations left it, every
row, sequence and trigger switch of schema jobsd (docs/testing.md, "Isolation")."""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest
from support.tokens import stored_token

import jobsd
from jobsd.registry import Registry
from jobsd.testing import JobsdDB, JobsdWorker, SessionDB

pytestmark = pytest.mark.timeout(30)


def schema_state(url: str) -> dict[str, Any]:
    """Return everything a reset puts back: each table's rows, each sequence's position,
    each trigger's switch (the schema jobsd's; partitions through their parents)."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT c.oid::regclass::text FROM pg_class AS c"
                " WHERE c.relnamespace = 'jobsd'::regnamespace AND c.relkind IN ('r', 'p')"
                " AND NOT c.relispartition ORDER BY 1"
            )
        ]
        state: dict[str, Any] = {
            table: conn.execute(
                f"SELECT coalesce(jsonb_agg(to_jsonb(t) ORDER BY to_jsonb(t)::text), '[]')"
                f" FROM {table} AS t"
            ).fetchone()
            for table in tables
        }
        state["sequences"] = conn.execute(
            "SELECT sequencename, last_value FROM pg_sequences WHERE schemaname = 'jobsd'"
            " ORDER BY 1"
        ).fetchall()
        state["triggers"] = conn.execute(
            "SELECT tgrelid::regclass::text, tgname, tgenabled FROM pg_trigger"
            " WHERE NOT tgisinternal AND tgrelid::regclass::text LIKE 'jobsd.%' ORDER BY 1, 2"
        ).fetchall()
    return state


async def pause_default_and_declare_mail(url: str) -> None:
    async with jobsd.Client(url) as client:
        await client.create_queue("mail", capacity=10)
        await client.pause_queue("default")


def test_a_reset_puts_back_every_row_sequence_and_switch_the_migrations_left(
    jobsd_db: JobsdDB, jobsd_session_db: SessionDB, registry: Registry
) -> None:
    fresh = schema_state(jobsd_db.url)
    assert fresh["jobsd.jobs"] == ([],) and fresh["jobsd.job_events"] == ([],)
    assert [q["name"] for q in fresh["jobsd.queues"][0]] == ["default"]

    # every kind of state a test may leave: jobs run and failed (history, hooks, keys,
    # dependencies), queues declared and paused (audit rows), tokens, a daemon's row,
    # the notify switch off
    @jobsd.handler("boom", registry=registry, on_fail=lambda job: None)
    def boom(ctx: jobsd.JobContext) -> None:
        raise RuntimeError("no")

    first = jobsd.enqueue_sync("boom", org_id="acme", concurrency_key="k", dedup_key="d")
    jobsd.enqueue_sync("boom", org_id="acme", depends_on=[first.id])
    JobsdWorker(jobsd_db.url, registry=registry).drain()
    anyio.run(pause_default_and_declare_mail, jobsd_db.url)
    stored_token(jobsd_db.url, "acme")
    with psycopg.connect(jobsd_db.url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobsd.workers (worker_id, hostname, pid, alive_until)"
            " VALUES ('gone', 'h', 1, now())"
        )
        conn.execute("ALTER TABLE jobsd.jobs DISABLE TRIGGER jobs_notify_insert")
    dirty = schema_state(jobsd_db.url)
    changed = {name for name in fresh if fresh[name] != dirty[name]}
    assert {
        "jobsd.jobs",
        "jobsd.job_events",
        "jobsd.fail_hooks",
        "jobsd.job_dependencies",
        "jobsd.concurrency_keys",
        "jobsd.queues",
        "jobsd.admin_actions",
        "jobsd.api_tokens",
        "jobsd.workers",
        "sequences",
        "triggers",
    } <= changed

    jobsd_session_db.reset()

    assert schema_state(jobsd_db.url) == fresh


def test_the_next_enqueue_after_a_reset_finds_a_queue_that_works(
    jobsd_db: JobsdDB, jobsd_session_db: SessionDB, worker: JobsdWorker, registry: Registry
) -> None:
    @jobsd.handler("ok", registry=registry)
    async def ok(ctx: jobsd.JobContext) -> None:
        return None

    for _ in range(2):
        jobsd_session_db.reset()
        job = jobsd.enqueue_sync("ok", org_id="acme")
        assert [(r.id, r.status) for r in worker.drain()] == [(job.id, "succeeded")]


def test_a_reset_reconnects_after_a_test_ended_its_session(
    jobsd_db: JobsdDB, jobsd_session_db: SessionDB
) -> None:
    jobsd.enqueue_sync("mail", org_id="acme")
    with psycopg.connect(jobsd_db.url, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
            " WHERE application_name = 'jobsd-testing' AND datname = current_database()"
        ).fetchone()
    assert ended == (1,)

    jobsd_session_db.reset()

    assert jobsd_db.enqueued_jobs() == []
