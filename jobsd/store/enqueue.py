"""Create jobs: the enqueue plan, its drivers, the dropped-connection retry, bulk inserts.

The enqueue logic is written once, as a plan of named statements (a generator that
yields a statement and receives its rows); small drivers run a plan on an async or a
sync connection. With ``org_scoped`` every statement runs through ``api.run_for_org``
(the API under the enqueue role: row-level security accepts the insert and shows the
re-reads), each still one round trip. On a caller's connection nothing is committed:
the job exists when the caller's transaction commits. On jobsd's own pool each
enqueue is one autocommit statement, retried on a dropped connection with the same
job id, so a retry can never create a second job, and an answer is given only after
the commit (``OutcomeUnknown`` when it cannot be).
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from jobsd.errors import (
    BackendUnavailable,
    DatabaseError,
    DuplicateJob,
    NoWritableServer,
    OutcomeUnknown,
    UnknownDependency,
    UnknownQueue,
)
from jobsd.jobspec import JobSpec
from jobsd.models import STATUS_BY_VALUE, Job
from jobsd.store import wire
from jobsd.store.api import run_for_org
from jobsd.store.db import (
    AsyncConn,
    AsyncPool,
    SyncConn,
    SyncPool,
    acquire,
    acquire_sync,
    db_errors,
)
from jobsd.store.named import Row, run_named, run_named_sync, run_named_tuples, sql_text

__all__ = [
    "BULK_COPY_MIN_JOBS",
    "COPY_REFUSED",
    "Plan",
    "Statement",
    "enqueue",
    "enqueue_many",
    "enqueue_on_pool",
    "enqueue_on_pool_sync",
    "enqueue_plan",
    "enqueue_sync",
    "new_job",
]

# Batches of this many jobs or more go in through COPY (fewer: one INSERT; below
# about 200 jobs the three more round trips of the transaction cost more than COPY saves).
BULK_COPY_MIN_JOBS = 500
# Connections whose role is under row-level security, where COPY FROM does not run.
COPY_REFUSED: weakref.WeakSet[AsyncConn] = weakref.WeakSet()
# Re-inserts after the dedup holder released its key between conflict and re-read.
_DEDUP_TRIES = 3
# Attempts of one enqueue on jobsd's own pool when the connection drops.
_CONNECTION_TRIES = 3
_FAILED_DEPENDENCY = ("failed", "cancelled")


@dataclass(frozen=True, slots=True)
class Statement:
    """A named query to run as one step of a plan."""

    name: str
    params: dict[str, Any]


Plan = Generator[Statement, list[Row], Job]
# Runs one named statement of a plan: run_named, or run_for_org with the spec's org.
_Execute = Callable[[AsyncConn, str, dict[str, Any]], Awaitable[list[Row]]]
_ExecuteSync = Callable[[SyncConn, str, dict[str, Any]], list[Row]]


def enqueue_plan(spec: JobSpec) -> Plan:
    """Insert a job, or find the one that holds its id or dedup key.

    The dedup holder may finish (and release its key) between our conflict and our
    re-read; then the insert is tried again, up to three times. Under row-level
    security a job of another org is invisible: when the id conflicted but no job
    with that id can be read, three times over, the id is taken by a job we may not
    see, and that is DuplicateJob, as when we can see it belongs to another org.

    With ``depends_on`` the plan writes more than once (mark the dependencies, insert
    the job ``blocked`` unless every dependency succeeded already, record the edges,
    fail the job at once if a dependency failed or was cancelled): drive it inside one
    transaction (``enqueue`` does).
    """
    blocked = False
    failed_dependency: dict[str, Any] | None = None
    if spec.depends_on:
        # Marking each dependency locks it: a dependency ending at this moment
        # commits first (and we read its end) or waits for our commit (and its
        # trigger finds our edges). Jobs of other orgs are not found.
        deps = list(spec.depends_on)
        rows = yield Statement("jobs_mark_dependencies", {"ids": deps, "org_id": spec.org_id})
        statuses = {r["id"]: r["status"] for r in rows}
        if any(d not in statuses for d in deps):
            # ended long enough ago to be archived: read where it lives now
            rows = yield Statement(
                "jobs_archived_statuses",
                {"ids": [d for d in deps if d not in statuses], "org_id": spec.org_id},
            )
            statuses.update({r["id"]: r["status"] for r in rows})
        missing = [str(d) for d in deps if d not in statuses]
        if missing:
            raise UnknownDependency(missing)
        blocked = any(statuses[d] != "succeeded" for d in deps)
        failed_dependency = next(
            ({"id": d, "status": statuses[d]} for d in deps if statuses[d] in _FAILED_DEPENDENCY),
            None,
        )
    if spec.id_may_exist:
        # An id given again may name a job that ended and was archived. Holding the
        # hot row (if any) keeps it from moving until the transaction ends; a move
        # in flight is waited for, and the next statement sees its result.
        held = yield Statement("jobs_hold_id", {"id": spec.id})
        if not held:
            rows = yield Statement("jobs_archived_org", {"id": spec.id})
            if rows and rows[0]["org_id"] is not None:
                if rows[0]["org_id"] != spec.org_id:
                    raise DuplicateJob(f"job id {spec.id} is already in use")
                rows = yield Statement("jobs_get", {"id": spec.id})
                if not rows:
                    raise DuplicateJob(
                        f"job id {spec.id} is already in use (by a job this session may not "
                        "read, hidden by row-level security)"
                    )
                return Job.from_row(rows[0])
    id_unseen = False
    for _ in range(_DEDUP_TRIES):
        rows = yield Statement("jobs_insert", spec.insert_params(blocked=blocked))
        if rows:
            job = new_job(spec, rows[0])
            if spec.depends_on:
                yield Statement(
                    "job_dependencies_insert",
                    {"job_id": job.id, "org_id": spec.org_id, "depends_on": deps},
                )
            if failed_dependency is not None:
                rows = yield Statement(
                    "jobs_fail_blocked",
                    {
                        "id": job.id,
                        "reason": f"dependency {failed_dependency['id']} "
                        f"{failed_dependency['status']}",
                    },
                )
                job = Job.from_row(rows[0])
            return job
        # Without a dedup key only the id can have conflicted (a re-sent spec).
        id_unseen = False
        if spec.id_may_exist or spec.dedup_key is None:
            rows = yield Statement("jobs_get", {"id": spec.id})
            if rows:
                existing = Job.from_row(rows[0])
                if existing.org_id != spec.org_id:
                    raise DuplicateJob(f"job id {spec.id} is already in use")
                return existing
            id_unseen = spec.id_may_exist
        if spec.dedup_key is not None:
            rows = yield Statement(
                "jobs_get_by_dedup_key", {"org_id": spec.org_id, "dedup_key": spec.dedup_key}
            )
            if rows:
                return Job.from_row(rows[0])
        rows = yield Statement("queues_exists", {"name": spec.queue})
        if not rows[0]["exists"]:
            raise UnknownQueue(spec.queue)
    if id_unseen:
        raise DuplicateJob(
            f"job id {spec.id} is already in use (by a job of another org, hidden by "
            "row-level security)"
        )
    raise DatabaseError(
        f"enqueue of {spec.type!r} gave up: dedup key {spec.dedup_key!r} kept changing hands"
    )


async def _drive(conn: AsyncConn, plan: Plan, execute: _Execute = run_named) -> Job:
    """Run a plan on an async connection, each statement through ``execute``."""
    statement = next(plan)
    while True:
        rows = await execute(conn, statement.name, statement.params)
        try:
            statement = plan.send(rows)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def _run_on_own_pool_sync(conn: SyncConn, name: str, params: dict[str, Any]) -> list[Row]:
    """``_run_on_own_pool`` on a sync connection."""
    if name == "jobs_insert":
        rows = wire.run_jobs_insert_sync(conn, params)
        if rows is not None:
            return rows
    return run_named_sync(conn, name, params)


def _drive_sync(conn: SyncConn, plan: Plan, execute: _ExecuteSync = run_named_sync) -> Job:
    """Run a plan on a sync connection, each statement through ``execute``."""
    statement = next(plan)
    while True:
        rows = execute(conn, statement.name, statement.params)
        try:
            statement = plan.send(rows)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


async def _run_on_own_pool(conn: AsyncConn, name: str, params: dict[str, Any]) -> list[Row]:
    """Run a statement on a connection of jobsd's own pool: the insert through libpq
    directly (``store.wire``), where it can go."""
    if name == "jobs_insert":
        rows = await wire.run_jobs_insert(conn, params)
        if rows is not None:
            return rows
    return await run_named(conn, name, params)


def _executor(spec: JobSpec, org_scoped: bool, own_pool: bool = False) -> _Execute:
    if not org_scoped:
        return _run_on_own_pool if own_pool else run_named

    async def scoped(conn: AsyncConn, name: str, params: dict[str, Any]) -> list[Row]:
        return await run_for_org(conn, spec.org_id, name, params)

    return scoped


async def enqueue(
    conn: AsyncConn, spec: JobSpec, *, org_scoped: bool = False, own_pool: bool = False
) -> Job:
    """Create the job of ``spec`` on ``conn`` (or return the one holding its id or key).

    In one transaction when the plan writes more than once (dependencies) or holds a
    given id while it looks for it in the archive: on a
    connection already in a transaction that is a savepoint; on jobsd's own
    autocommit connections a transaction of its own. ``own_pool``: ``conn`` is one of
    jobsd's own, so the insert may go through libpq directly (``store.wire``). Raises
    UnknownQueue, QueueFull, UnknownDependency, DuplicateJob, InvalidPayload,
    BackendUnavailable, DatabaseError.
    """
    execute = _executor(spec, org_scoped, own_pool)
    with db_errors(spec.operation):
        if not (spec.depends_on or spec.id_may_exist):
            return await _drive(conn, enqueue_plan(spec), execute)
        async with conn.transaction():
            return await _drive(conn, enqueue_plan(spec), execute)


def enqueue_sync(conn: SyncConn, spec: JobSpec, *, own_pool: bool = False) -> Job:
    """Create the job of ``spec`` on a sync connection; see ``enqueue``."""
    execute = _run_on_own_pool_sync if own_pool else run_named_sync
    with db_errors(spec.operation):
        if not (spec.depends_on or spec.id_may_exist):
            return _drive_sync(conn, enqueue_plan(spec), execute)
        with conn.transaction():
            return _drive_sync(conn, enqueue_plan(spec), execute)


class _DroppedConnection:
    """The one rule for an enqueue on jobsd's own pool whose connection drops.

    Up to three attempts, the same job id each time (so the next attempt finds the
    job if the last one committed). No connection within the pool timeout is an
    answer at once: the pool already retried. When an attempt may have committed and
    the last one fails, the caller hears ``OutcomeUnknown``: retry with the same id.
    """

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.attempt = 0
        self.sent = False
        self._sent_before = False
        self._connected = False

    def start(self) -> None:
        """Count an attempt."""
        self.attempt += 1
        self._connected = False
        self._sent_before = self.sent

    def connected(self) -> None:
        """Note that this attempt got a connection: statements may reach the database."""
        self._connected = self.sent = True

    def failed(self, exc: BackendUnavailable) -> float:
        """Return how long to wait before the next attempt, or raise the final error."""
        if isinstance(exc, NoWritableServer) and not self._sent_before:
            raise exc  # a read-only server wrote nothing, and trying again would not help
        if self.attempt >= _CONNECTION_TRIES or not self._connected:
            if self.sent and self.spec.id_may_exist:
                raise OutcomeUnknown(
                    f"enqueue of job {self.spec.id} could not be confirmed: "
                    f"retry with the same job id ({exc})"
                ) from exc.__cause__
            raise exc
        # Whatever happened, the same id makes the next attempt safe.
        self.spec = replace(self.spec, id_may_exist=True)
        return 0.05 * self.attempt


async def enqueue_on_pool(pool: AsyncPool, spec: JobSpec, *, org_scoped: bool = False) -> Job:
    """Create the job of ``spec`` on a pooled connection, retrying a dropped connection.

    Raises what ``enqueue`` raises, and OutcomeUnknown (retry with the same job id).
    """
    retry = _DroppedConnection(spec)
    while True:
        retry.start()
        try:
            async with acquire(pool, spec.operation) as conn:
                retry.connected()
                return await enqueue(conn, retry.spec, org_scoped=org_scoped, own_pool=True)
        except BackendUnavailable as exc:
            await asyncio.sleep(retry.failed(exc))


def enqueue_on_pool_sync(pool: SyncPool, spec: JobSpec) -> Job:
    """Create the job of ``spec`` on a sync pool; see ``enqueue_on_pool``."""
    retry = _DroppedConnection(spec)
    while True:
        retry.start()
        try:
            with acquire_sync(pool, spec.operation) as conn:
                retry.connected()
                return enqueue_sync(conn, retry.spec, own_pool=True)
        except BackendUnavailable as exc:
            time.sleep(retry.failed(exc))


async def enqueue_many(pool: AsyncPool, specs: Sequence[JobSpec]) -> list[Job]:
    """Create many jobs at once; return them in order (existing ones on hits).

    All or nothing. A batch that cannot hit an existing job (no dedup key, no id given,
    no dependency) goes in at once: ``BULK_COPY_MIN_JOBS`` jobs or more through
    ``COPY`` in one transaction, fewer in one autocommit ``INSERT``; an unknown queue
    fails it through the queue's foreign key. Any other batch, and one whose ids are
    in already (the same batch sent again), runs in one transaction: conflicts are
    resolved and dependencies recorded one by one after the insert.
    """
    operation = f"bulk enqueue of {len(specs)} jobs"
    async with acquire(pool, operation) as conn:
        with db_errors(operation):
            if not any(s.dedup_key is not None or s.id_may_exist or s.depends_on for s in specs):
                fresh = await _insert_fresh(conn, specs)
                if fresh is not None:
                    return fresh
            return await _insert_resolving(conn, specs)


async def _insert_fresh(conn: AsyncConn, specs: Sequence[JobSpec]) -> list[Job] | None:
    """Insert jobs whose ids should be new; None when one of them is in already."""
    if len(specs) >= BULK_COPY_MIN_JOBS and conn not in COPY_REFUSED:
        try:
            jobs = await _copy_fresh(conn, specs)
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "jobs_pkey":
                raise
            return None
        if jobs is not None:
            return jobs
    rows = await run_named_tuples(conn, "jobs_insert_many", _many_params(specs))
    if len(rows) < len(specs):
        return None
    payloads = _decode_payloads(specs)
    return [new_job(s, row, p) for s, row, p in zip(specs, rows, payloads, strict=True)]


async def _copy_fresh(conn: AsyncConn, specs: Sequence[JobSpec]) -> list[Job] | None:
    """Insert jobs whose ids should be new through COPY, in one transaction.

    Each job's status is decided against the transaction's now(), as ``jobs_insert_many``
    decides it. None when row-level security applies to the connection's role (COPY
    FROM does not run then): the caller inserts instead.
    """
    async with conn.transaction():
        ((now, row_security),) = await run_named_tuples(conn, "jobs_copy_start", {})
        if row_security:
            COPY_REFUSED.add(conn)
            return None
        run_afters = [now if s.run_after is None else s.run_after for s in specs]
        statuses = ["scheduled" if at > now else "queued" for at in run_afters]
        async with conn.cursor() as cursor, cursor.copy(sql_text("jobs_copy")) as copy:
            for spec, status, run_after in zip(specs, statuses, run_afters, strict=True):
                await copy.write_row(
                    (
                        spec.id,
                        spec.org_id,
                        spec.type,
                        spec.queue,
                        status,
                        spec.payload_json,
                        run_after,
                        spec.priority,
                        spec.concurrency_key,
                        spec.trace_context,
                    )
                )
    payloads = _decode_payloads(specs)
    return [
        new_job(spec, (spec.id, status, at, now), payload)
        for spec, status, at, payload in zip(specs, statuses, run_afters, payloads, strict=True)
    ]


async def _insert_resolving(conn: AsyncConn, specs: Sequence[JobSpec]) -> list[Job]:
    """Insert a batch in one transaction, resolving hits and dependencies one by one."""
    async with conn.transaction():
        names = sorted({s.queue for s in specs})
        found = await run_named(conn, "queues_existing", {"names": names})
        missing = set(names) - {r["name"] for r in found}
        if missing:
            raise UnknownQueue(sorted(missing)[0])
        # Jobs with dependencies take the one-by-one plan, in order, after the
        # others: they may depend on jobs of this very batch.
        plain = [s for s in specs if not s.depends_on]
        by_id = {s.id: s for s in plain}
        rows = await run_named_tuples(conn, "jobs_insert_many", _many_params(plain))
        inserted = {row[0]: new_job(by_id[row[0]], row) for row in rows}
        for spec in specs:
            if spec.depends_on:
                inserted[spec.id] = await _drive(conn, enqueue_plan(spec))
        result = []
        for spec in specs:
            job = inserted.get(spec.id)
            if job is None:  # conflict on the id or the key: resolve it like one enqueue
                job = await _drive(conn, enqueue_plan(replace(spec, id_may_exist=True)))
            result.append(job)
        return result


def _decode_payloads(specs: Sequence[JobSpec]) -> list[dict[str, Any]]:
    """Decode the payloads of a batch in one call (one ``json.loads`` per job cost a
    sixth of a bulk-enqueued job's client CPU)."""
    decoded: list[dict[str, Any]] = json.loads(
        "[" + ",".join(spec.payload_json for spec in specs) + "]"
    )
    return decoded


def new_job(spec: JobSpec, row: Row | Sequence[Any], payload: dict[str, Any] | None = None) -> Job:
    """Return the job just inserted for ``spec``, from what the insert returned.

    ``row`` holds (id, status, run_after, created_at), as a dict or in that order: the
    rest is the spec's, or what every new job starts with. ``payload`` is the spec's
    payload decoded, when the caller decoded it already.
    """
    if isinstance(row, dict):
        status, run_after, created_at = row["status"], row["run_after"], row["created_at"]
    else:
        status, run_after, created_at = row[1], row[2], row[3]
    # positional, in Job's field order: 22 keywords cost a third of a bulk-enqueued
    # job's new_job (tests/unit/test_enqueue_new_job.py checks it against Job(**...))
    return Job(
        spec.id,
        spec.org_id,
        spec.type,
        spec.queue,
        STATUS_BY_VALUE[status],
        0,  # attempts
        spec.dedup_key,
        json.loads(spec.payload_json) if payload is None else payload,
        None,  # progress
        None,  # report
        None,  # error
        None,  # reason
        run_after,
        None,  # lease_id
        None,  # worker_id
        created_at,
        None,  # started_at
        None,  # finished_at
        None,  # cancel_requested_at
        spec.priority,
        spec.concurrency_key,
        json.loads(spec.trace_context) if spec.trace_context else None,
    )


_MANY_COLUMNS = {
    "ids": "id",
    "org_ids": "org_id",
    "types": "type",
    "queues": "queue",
    "dedup_keys": "dedup_key",
    "payloads": "payload_json",
    "run_afters": "run_after",
    "priorities": "priority",
    "concurrency_keys": "concurrency_key",
    "trace_contexts": "trace_context",
}


def _many_params(specs: Iterable[JobSpec]) -> dict[str, list[Any]]:
    """Return the parameters of ``jobs_insert_many``: one array per column."""
    chosen = list(specs)
    return {param: [getattr(s, field) for s in chosen] for param, field in _MANY_COLUMNS.items()}
