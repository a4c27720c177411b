"""The bulk actions (jobsd.ops.bulk, migration 0031): every job of a filter retried,
cancelled or resolved in one call, admitted and audited like the single actions, bounded,
scoped by org, and idempotent when repeated."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.history import assert_history_complete
from support.jobs import make_job, make_jobs

from jobsd.ops import Caller
from jobsd.ops.bulk import (
    BulkAction,
    BulkOutcome,
    cancel_many,
    cancel_many_sync,
    resolve_many,
    retry_many,
    retry_many_sync,
)

pytestmark = pytest.mark.anyio

OP = Caller.as_operator("cli:alice")
CLAIM = {"attempts": 1, "worker_id": "w1"}
# one second apart, oldest first: "oldest first" is then the order of the ids returned
AGED = sql.SQL("now() - make_interval(secs => 100000 - g)")


def scalar(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params or None).fetchone()
    return row[0] if row else None


def retries_of(conn: psycopg.Connection[Any], ids: list[uuid.UUID]) -> dict[uuid.UUID, Any]:
    """Return the retry of each job that has one: retried job -> (new id, status)."""
    rows = conn.execute(
        "SELECT retry_of, id, status FROM jobsd.all_jobs WHERE retry_of = ANY(%s)", (ids,)
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def audit(conn: psycopg.Connection[Any], bulk_id: int | None) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT actor, org_id, action, filter, matched, done, refused "
        "FROM jobsd.bulk_actions WHERE id = %s",
        (bulk_id,),
    ).fetchone()
    assert row is not None, f"no audit row {bulk_id}"
    return tuple(row)


def counts(conn: psycopg.Connection[Any]) -> tuple[int, int, int]:
    """Jobs, history rows and audit rows, everywhere: what a change would change."""
    return (
        scalar(conn, "SELECT count(*) FROM jobsd.all_jobs"),
        scalar(conn, "SELECT count(*) FROM jobsd.all_job_events"),
        scalar(conn, "SELECT count(*) FROM jobsd.bulk_actions"),
    )


async def test_a_retry_of_2000_failed_jobs_is_one_fast_call_and_a_repeat_does_nothing(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    failed = make_jobs(conn, 2000, status="failed", type="mail", claim=CLAIM, created_at=AGED)
    make_job(conn, status="failed", type="other", claim=CLAIM)  # another type: not taken
    started = time.monotonic()
    out = await retry_many(aconn, OP, type="mail", limit=2000)
    took_s = time.monotonic() - started
    assert (out.matched, out.done, out.refused, out.remaining) == (2000, 2000, {}, 0)
    assert out.id is not None and not out.dry_run
    # one transaction of a few statements: well under a second here; a generous bound
    assert took_s < 10, f"a bulk retry of 2000 jobs took {took_s:.1f} s"
    made = retries_of(conn, failed)
    assert set(made) == set(failed)
    assert {status for _, status in made.values()} == {"queued"}
    # each line of history names the actor and the call
    actor = f"cli:alice (bulk {out.id})"
    first, new_first = failed[0], made[failed[0]][0]
    note = conn.execute(
        "SELECT worker_id, reason "
        "FROM jobsd.all_job_events WHERE job_id = %s ORDER BY id DESC LIMIT 1",
        (first,),
    ).fetchone()
    assert note == (actor, f"retried as {new_first}")
    born = conn.execute(
        "SELECT worker_id, reason FROM jobsd.all_job_events WHERE job_id = %s", (new_first,)
    ).fetchall()
    assert born == [(actor, f"retry of {first}")]
    assert (
        scalar(conn, "SELECT count(*) FROM jobsd.all_job_events WHERE worker_id = %s", actor)
        == 4000
    )
    row = audit(conn, out.id)
    assert row[:3] == ("cli:alice", None, "retry")
    assert row[3] == {"status": "failed", "type": "mail", "limit": 2000, "force": False}
    assert row[4:] == (2000, 2000, {})
    assert_history_complete(conn)

    before = counts(conn)
    again = await retry_many(aconn, OP, type="mail", limit=2000)
    assert (again.matched, again.done, again.remaining) == (0, 0, 0)
    assert counts(conn)[:2] == before[:2]  # nothing new but the call's audit row


async def test_a_retry_into_a_queue_with_room_for_1500_retries_1500_then_the_rest(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    conn.execute("INSERT INTO jobsd.queues (name) VALUES ('capped')")
    failed = make_jobs(conn, 2000, status="failed", queue="capped", claim=CLAIM, created_at=AGED)
    conn.execute("UPDATE jobsd.queues SET capacity = 1500 WHERE name = 'capped'")
    out = await retry_many(aconn, OP, queue="capped", limit=5000)
    assert (out.matched, out.done, out.refused, out.remaining) == (
        2000,
        1500,
        {"queue_full": 500},
        500,
    )
    assert "500 refused (queue full: 500), 500 still match" in out.summary()
    made = retries_of(conn, failed)
    assert set(made) == set(failed[:1500])  # the oldest ones
    assert audit(conn, out.id)[4:] == (2000, 1500, {"queue_full": 500})
    # a refusal wrote nothing for its job: no retry, no note
    assert (
        scalar(conn, "SELECT count(*) FROM jobsd.all_job_events WHERE job_id = %s", failed[-1]) == 3
    )

    # room frees (a bulk cancel of 600 of the new jobs): the same call retries the rest
    freed = await cancel_many(aconn, OP, queue="capped", status="queued", limit=600)
    assert (freed.done, freed.remaining) == (600, 900)
    rest = await retry_many(aconn, OP, queue="capped", limit=5000)
    assert (rest.matched, rest.done, rest.refused, rest.remaining) == (500, 500, {}, 0)
    assert set(retries_of(conn, failed)) == set(failed)
    assert_history_complete(conn)


async def test_an_orgs_quota_refuses_that_org_only(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    conn.execute("INSERT INTO jobsd.queues (name) VALUES ('fair')")
    acme = make_jobs(conn, 4, status="failed", queue="fair", org_id="acme", created_at=AGED)
    globex = make_jobs(conn, 4, status="failed", queue="fair", org_id="globex", created_at=AGED)
    conn.execute("UPDATE jobsd.queues SET org_open_limit = 3 WHERE name = 'fair'")
    make_job(conn, queue="fair", org_id="acme")  # acme holds one open job there already
    out = await retry_many(aconn, OP, queue="fair")
    assert (out.done, out.refused, out.remaining) == (5, {"org_quota": 3}, 3)
    assert len(retries_of(conn, acme)) == 2 and len(retries_of(conn, globex)) == 3


async def test_an_orgs_caller_never_touches_another_orgs_jobs(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    mine = make_jobs(conn, 3, status="failed", org_id="acme")
    theirs = make_jobs(conn, 3, status="failed", org_id="globex")
    running = make_job(conn, status="running", org_id="globex")
    acme = Caller.for_org("acme", "api")
    # naming another org matches nothing, as listing it lists nothing
    for action in (
        retry_many(aconn, acme, org_id="globex"),
        cancel_many(aconn, acme, org_id="globex"),
        resolve_many(aconn, acme, "failed", org_id="globex"),
    ):
        assert (await action).matched == 0
    out = await retry_many(aconn, acme)
    assert (out.done, out.remaining) == (3, 0)
    assert set(retries_of(conn, mine)) == set(mine) and retries_of(conn, theirs) == {}
    assert (await cancel_many(aconn, acme)).done == 3  # acme's three new jobs
    assert scalar(conn, "SELECT status FROM jobsd.jobs WHERE id = %s", running) == "running"
    assert audit(conn, out.id)[1] == "acme"
    # an operator may name the org
    assert (await retry_many(aconn, OP, org_id="globex", dry_run=True)).matched == 3


async def test_the_limit_bounds_a_call_and_the_next_one_continues(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    failed = make_jobs(conn, 250, status="failed", created_at=AGED)
    first = await retry_many(aconn, OP, limit=100)
    assert (first.matched, first.done, first.remaining) == (100, 100, 150)
    assert set(retries_of(conn, failed)) == set(failed[:100])
    second = await retry_many(aconn, OP, limit=100)
    assert (second.done, second.remaining) == (100, 50)
    assert set(retries_of(conn, failed)) == set(failed[:200])


async def test_created_since_and_until_bound_the_jobs(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    now = datetime.now(UTC)
    old = make_job(conn, status="failed", created_at=now - timedelta(days=3))
    mid = make_job(conn, status="failed", created_at=now - timedelta(days=2))
    make_job(conn, status="failed", created_at=now - timedelta(hours=1))
    out = await retry_many(
        aconn, OP, since=now - timedelta(days=2, hours=1), until=now - timedelta(days=1)
    )
    assert out.done == 1 and set(retries_of(conn, [old, mid])) == {mid}


async def test_a_bulk_cancel_cancels_waiting_jobs_and_asks_running_ones(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    queued = make_jobs(conn, 3, type="x")
    scheduled = make_job(conn, status="scheduled", type="x")
    running = make_jobs(conn, 2, status="running", type="x", claim=CLAIM)
    done = make_job(conn, status="succeeded", type="x", claim=CLAIM)
    stuck = make_job(conn, status="recovery_required", type="x", claim=CLAIM)
    out = await cancel_many(aconn, OP, type="x", reason="cancelled by operator (bulk)")
    assert (out.matched, out.done, out.requested, out.remaining) == (6, 6, 2, 0)
    rows = dict(
        conn.execute(
            "SELECT id, status || ':' || (cancel_requested_at IS NOT NULL)::text "
            "FROM jobsd.jobs WHERE type = 'x'"
        ).fetchall()
    )
    assert {rows[j] for j in [*queued, scheduled]} == {"cancelled:true"}
    assert {rows[j] for j in running} == {"running:true"}
    assert rows[done] == "succeeded:false" and rows[stuck] == "recovery_required:false"
    actor = f"cli:alice (bulk {out.id})"
    history = conn.execute(
        "SELECT job_id, from_status, to_status, worker_id, reason FROM jobsd.all_job_events "
        "WHERE worker_id = %s ORDER BY id",
        (actor,),
    ).fetchall()
    assert {(h[1], h[2], h[4]) for h in history} == {
        ("queued", "cancelled", "cancelled by operator (bulk)"),
        ("scheduled", "cancelled", "cancelled by operator (bulk)"),
        ("running", "running", "cancel requested"),
    }
    assert len(history) == 6
    # a repeat finds nothing: cancelled jobs are not open, running ones were asked
    again = await cancel_many(aconn, OP, type="x")
    assert (again.matched, again.done) == (0, 0)
    # one state only
    more = make_jobs(conn, 2, type="y")
    blocked = make_job(conn, status="blocked", type="y")
    only = await cancel_many(aconn, OP, type="y", status="blocked")
    assert only.done == 1
    assert scalar(conn, "SELECT status FROM jobsd.jobs WHERE id = %s", blocked) == "cancelled"
    assert {scalar(conn, "SELECT status FROM jobsd.jobs WHERE id = %s", j) for j in more} == {
        "queued"
    }
    assert_history_complete(conn)


async def test_a_bulk_resolve_settles_jobs_awaiting_recovery(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    stuck = make_jobs(conn, 3, status="recovery_required", claim=CLAIM, created_at=AGED)
    other = make_job(conn, status="running", claim=CLAIM)
    out = await resolve_many(aconn, OP, "succeeded", limit=2)
    assert (out.matched, out.done, out.remaining) == (2, 2, 1)
    rows = dict(conn.execute("SELECT id, status FROM jobsd.jobs").fetchall())
    assert [rows[j] for j in stuck] == ["succeeded", "succeeded", "recovery_required"]
    assert rows[other] == "running"
    last = conn.execute(
        "SELECT worker_id, reason "
        "FROM jobsd.all_job_events WHERE job_id = %s ORDER BY id DESC LIMIT 1",
        (stuck[0],),
    ).fetchone()
    assert last == (f"cli:alice (bulk {out.id})", "resolved as succeeded by an operator (bulk)")
    rest = await resolve_many(aconn, OP, "queued")  # the state a requeue leaves it in
    assert (rest.done, rest.remaining) == (1, 0)
    assert scalar(conn, "SELECT status FROM jobsd.jobs WHERE id = %s", stuck[2]) == "queued"
    assert audit(conn, rest.id)[3] == {"limit": 1000, "outcome": "queued"}
    assert (await resolve_many(aconn, OP, "failed")).matched == 0
    assert_history_complete(conn)


async def test_a_dry_run_counts_and_changes_nothing(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    make_jobs(conn, 30, status="failed")
    make_jobs(conn, 4)
    make_job(conn, status="recovery_required")
    before = counts(conn)
    dry = await retry_many(aconn, OP, limit=20, dry_run=True)
    assert (dry.matched, dry.done, dry.remaining, dry.id, dry.dry_run) == (20, 0, 30, None, True)
    assert dry.summary() == "20 would be retried, 30 match"
    assert (await cancel_many(aconn, OP, dry_run=True)).matched == 4
    assert (await resolve_many(aconn, OP, "failed", dry_run=True)).matched == 1
    assert counts(conn) == before


async def test_refusals_of_the_single_retry_are_refusals_here(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    conn.execute(
        "INSERT INTO jobsd.job_types (type, delivery, max_attempts) "
        "VALUES ('charge', 'at_most_once', 1)"
    )
    charge = make_job(conn, status="failed", type="charge")
    parent = make_job(conn, status="failed", type="p")
    child = make_job(conn, status="cancelled", type="c")
    conn.execute(
        "INSERT INTO jobsd.job_dependencies (job_id, depends_on, org_id) VALUES (%s, %s, 'o')",
        (child, parent),
    )
    out = await retry_many(aconn, OP, type="charge")
    assert (out.done, out.refused, out.remaining) == (0, {"at_most_once": 1}, 1)
    assert "at_most_once type (retry with force): 1" in out.summary()
    forced = await retry_many(aconn, OP, type="charge", force=True)
    assert forced.done == 1
    assert scalar(conn, "SELECT reason FROM jobsd.jobs WHERE retry_of = %s", charge) == (
        f"retry (forced) of {charge}"
    )
    blocked = await retry_many(aconn, OP, status="cancelled")
    assert blocked.refused == {"dependency": 1}


async def test_an_archived_job_is_retried_and_its_note_goes_to_the_archive(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    failed = make_jobs(conn, 3, status="failed", finished_at=sql.SQL("now() - interval '1 h'"))
    assert scalar(conn, "SELECT jobsd.archive_move(100, 60)") == 3
    out = await retry_many(aconn, OP)
    assert (out.done, out.remaining) == (3, 0)
    assert set(retries_of(conn, failed)) == set(failed)
    notes = scalar(
        conn,
        "SELECT count(*) FROM jobsd.job_events_archive WHERE reason LIKE 'retried as %%' "
        "AND worker_id = %s",
        f"cli:alice (bulk {out.id})",
    )
    assert notes == 3
    assert (await retry_many(aconn, OP)).matched == 0


@pytest.mark.parametrize(
    ("action", "options", "message"),
    [
        (BulkAction.RETRY, {"status": "queued"}, "applies to failed or cancelled jobs, not queued"),
        (BulkAction.RETRY, {"status": "done"}, "unknown status 'done'"),
        (BulkAction.CANCEL, {"status": "failed"}, "a bulk cancel applies to queued, scheduled"),
        (BulkAction.RESOLVE, {"status": "running"}, "applies to recovery_required jobs"),
        (BulkAction.RETRY, {"limit": 0}, "limit must be between 1 and 10000, not 0"),
        (BulkAction.CANCEL, {"limit": 10001}, "limit must be between 1 and 10000, not 10001"),
        (BulkAction.RETRY, {"since": datetime(2030, 1, 1)}, "since must carry a time zone"),
        (
            BulkAction.RETRY,
            {"since": datetime(2030, 1, 2, tzinfo=UTC), "until": datetime(2030, 1, 1, tzinfo=UTC)},
            "until .* must be after since",
        ),
        (BulkAction.CANCEL, {"queue": "nope"}, "unknown queue 'nope'"),
        (BulkAction.RETRY, {"type": ""}, "type must not be empty"),
        (BulkAction.RESOLVE, {}, "resolve as succeeded, failed or requeue"),
    ],
)
async def test_bad_input_is_refused_and_nothing_is_written(
    conn: psycopg.Connection[Any],
    aconn: psycopg.AsyncConnection[Any],
    action: BulkAction,
    options: dict[str, Any],
    message: str,
) -> None:
    make_job(conn, status="failed")
    make_job(conn)
    before = counts(conn)
    call: Any
    if action is BulkAction.RETRY:
        call = retry_many(aconn, OP, **options)
    elif action is BulkAction.CANCEL:
        call = cancel_many(aconn, OP, **options)
    else:
        call = resolve_many(aconn, OP, "done" if not options else "failed", **options)
    with pytest.raises(ValueError, match=message):
        await call
    assert counts(conn) == before


def test_the_sync_twins(conn: psycopg.Connection[Any]) -> None:
    failed = make_jobs(conn, 2, status="failed")
    queued = make_job(conn, type="q")
    with psycopg.connect(conn.info.dsn, autocommit=True) as sync:
        out = retry_many_sync(sync, Caller.for_org("o", "script"))
        assert isinstance(out, BulkOutcome) and out.done == 2
        assert cancel_many_sync(sync, OP, type="q").done == 1
    assert set(retries_of(conn, failed)) == set(failed)
    assert scalar(conn, "SELECT status FROM jobsd.jobs WHERE id = %s", queued) == "cancelled"


async def test_the_clients_bulk_methods(conn: psycopg.Connection[Any], db_url: str) -> None:
    from jobsd import Client, SyncClient

    failed = make_jobs(conn, 2, status="failed", org_id="acme", claim=CLAIM)
    make_job(conn, status="failed", org_id="globex", claim=CLAIM)
    stuck = make_job(conn, status="recovery_required", org_id="acme", claim=CLAIM)
    async with Client(db_url) as client:
        out = await client.retry_many(org_id="acme", limit=10)
        assert (out.done, out.remaining) == (2, 0)
        assert (await client.cancel_many(org_id="acme", dry_run=True)).matched == 2
    with SyncClient(db_url) as sync:
        assert sync.cancel_many(org_id="acme").done == 2
        assert sync.resolve_many("requeue", org_id="acme").done == 1
        assert sync.retry_many(dry_run=True).matched == 1  # globex's, as an operator
    assert set(retries_of(conn, failed)) == set(failed)
    assert scalar(conn, "SELECT status FROM jobsd.jobs WHERE id = %s", stuck) == "queued"
    actor = scalar(conn, "SELECT actor FROM jobsd.bulk_actions WHERE id = %s", out.id)
    assert actor == "client"
