"""Enqueue jobs and read them back: on jobsd's own pool or in the caller's transaction.

The enqueue logic is written once, as a plan of named statements (a generator that
yields a statement and receives its rows); small drivers run a plan on an async or a
sync connection. On a caller's connection nothing is committed: the job exists when
the caller's transaction commits. On jobsd's own pool each enqueue is one autocommit
statement, retried on a dropped connection with the same job id, so a retry can never
create a second job, and an answer is given only after the commit.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Self

import anyio
import psycopg

from jobsd.admin.queues import (
    UNCHANGED,
    QueueInfo,
    Unchanged,
    create_queue,
    drop_queue,
    list_queues,
    pause_queue,
    resume_queue,
    set_queue_limits,
)
from jobsd.errors import (
    BackendUnavailable,
    DatabaseError,
    DuplicateJob,
    JobNotFound,
    OutcomeUnknown,
    UnknownDependency,
    UnknownQueue,
)
from jobsd.ids import uuid7
from jobsd.jsonsafe import encode_object
from jobsd.models import Job, JobEvent
from jobsd.settings import Settings
from jobsd.store import queries
from jobsd.store.db import AsyncPool, SyncPool, db_errors, make_async_pool, make_sync_pool

__all__ = [
    "Client",
    "JobSpec",
    "SyncClient",
    "enqueue_plan",
    "run_enqueue",
    "run_enqueue_sync",
]

log = logging.getLogger(__name__)

# Re-inserts after the dedup holder released its key between conflict and re-read.
_DEDUP_TRIES = 3
# Attempts of one enqueue on jobsd's own pool when the connection drops.
_CONNECTION_TRIES = 3
# Bounds of a job's priority (lower runs first) and of its dependency list.
PRIORITY_MIN, PRIORITY_MAX = -1_000_000, 1_000_000
MAX_DEPENDENCIES = 1_000
_FAILED_DEPENDENCY = ("failed", "cancelled")


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job to create, checked and serialized."""

    id: uuid.UUID
    type: str
    org_id: str
    queue: str
    payload_json: str
    dedup_key: str | None
    run_after: datetime | None
    # the id was given by the caller, or an earlier attempt may have committed it
    id_may_exist: bool
    priority: int = 0
    concurrency_key: str | None = None
    depends_on: tuple[uuid.UUID, ...] = ()

    @classmethod
    def build(
        cls,
        type: str,
        payload: dict[str, Any] | None,
        *,
        org_id: str,
        queue: str = "default",
        dedup_key: str | None = None,
        run_after: datetime | None = None,
        job_id: uuid.UUID | str | None = None,
        max_payload_bytes: int | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        depends_on: Iterable[uuid.UUID | str] = (),
    ) -> JobSpec:
        """Check and serialize the arguments of an enqueue (raises InvalidPayload, ValueError)."""
        if not type:
            raise ValueError("job type must be a non-empty string")
        if not org_id:
            raise ValueError("org_id must be a non-empty string")
        if run_after is not None and run_after.tzinfo is None:
            raise ValueError("run_after must be timezone-aware")
        if (
            not isinstance(priority, int)
            or isinstance(priority, bool)
            or not PRIORITY_MIN <= priority <= PRIORITY_MAX
        ):
            raise ValueError(
                f"priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}, "
                f"got {priority!r}"
            )
        if concurrency_key is not None and (
            not concurrency_key or len(concurrency_key.encode("utf-8", "surrogatepass")) > 255
        ):
            raise ValueError("concurrency_key must be a non-empty string of at most 255 bytes")
        text = encode_object(
            {} if payload is None else payload, what="payload", max_bytes=max_payload_bytes
        )
        given = uuid.UUID(str(job_id)) if job_id is not None else None
        deps = _dependency_ids(depends_on)
        if given is not None and given in deps:
            raise ValueError(f"job {given} cannot depend on itself")
        return cls(
            id=given or uuid7(),
            type=type,
            org_id=org_id,
            queue=queue,
            payload_json=text,
            dedup_key=dedup_key,
            run_after=run_after,
            id_may_exist=given is not None,
            priority=priority,
            concurrency_key=concurrency_key,
            depends_on=deps,
        )

    def insert_params(self, *, blocked: bool = False) -> dict[str, Any]:
        """Return the parameters of ``jobs_insert``."""
        return {
            "id": self.id,
            "org_id": self.org_id,
            "type": self.type,
            "queue": self.queue,
            "dedup_key": self.dedup_key,
            "payload": self.payload_json,
            "run_after": self.run_after,
            "priority": self.priority,
            "concurrency_key": self.concurrency_key,
            "blocked": blocked,
        }


def _dependency_ids(depends_on: Iterable[uuid.UUID | str]) -> tuple[uuid.UUID, ...]:
    if isinstance(depends_on, (str, uuid.UUID)):
        depends_on = [depends_on]
    ids: list[uuid.UUID] = []
    for value in depends_on:
        try:
            key = value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
        except ValueError:
            raise ValueError(f"depends_on: {value!r} is not a job id") from None
        if key not in ids:
            ids.append(key)
    if len(ids) > MAX_DEPENDENCIES:
        raise ValueError(f"depends_on: at most {MAX_DEPENDENCIES} jobs, got {len(ids)}")
    return tuple(ids)


@dataclass(frozen=True, slots=True)
class Statement:
    """A named query to run as one step of a plan."""

    name: str
    params: dict[str, Any]


Plan = Generator[Statement, list[dict[str, Any]], Job]


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
    transaction (``run_enqueue`` does).
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
        missing = [str(d) for d in deps if d not in statuses]
        if missing:
            raise UnknownDependency(missing)
        blocked = any(statuses[d] != "succeeded" for d in deps)
        failed_dependency = next(
            ({"id": d, "status": statuses[d]} for d in deps if statuses[d] in _FAILED_DEPENDENCY),
            None,
        )
    id_unseen = False
    for _ in range(_DEDUP_TRIES):
        rows = yield Statement("jobs_insert", spec.insert_params(blocked=blocked))
        if rows:
            job = Job.from_row(rows[0])
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


# Runs one named statement of a plan: queries.run_named, or the API's org-scoped runner.
Execute = Callable[[psycopg.AsyncConnection[Any], str, dict[str, Any]], Awaitable[list[Any]]]


async def run_plan(
    conn: psycopg.AsyncConnection[Any],
    plan: Plan,
    operation: str,
    execute: Execute = queries.run_named,
) -> Job:
    """Drive a plan on an async connection, each statement through ``execute``."""
    with db_errors(operation):
        statement = next(plan)
        while True:
            rows = await execute(conn, statement.name, statement.params)
            try:
                statement = plan.send(rows)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]


def run_plan_sync(conn: psycopg.Connection[Any], plan: Plan, operation: str) -> Job:
    """Drive a plan on a sync connection."""
    with db_errors(operation):
        statement = next(plan)
        while True:
            rows = queries.run_named_sync(conn, statement.name, statement.params)
            try:
                statement = plan.send(rows)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]


async def run_enqueue(
    conn: psycopg.AsyncConnection[Any],
    spec: JobSpec,
    operation: str,
    execute: Execute = queries.run_named,
) -> Job:
    """Drive the enqueue plan of ``spec``: in one transaction when it writes more than once.

    On a connection already in a transaction that is a savepoint; on jobsd's own
    autocommit connections it is a transaction of its own.
    """
    if not spec.depends_on:
        return await run_plan(conn, enqueue_plan(spec), operation, execute)
    with db_errors(operation):
        async with conn.transaction():
            return await run_plan(conn, enqueue_plan(spec), operation, execute)


def run_enqueue_sync(conn: psycopg.Connection[Any], spec: JobSpec, operation: str) -> Job:
    """Drive the enqueue plan of ``spec`` on a sync connection; see ``run_enqueue``."""
    if not spec.depends_on:
        return run_plan_sync(conn, enqueue_plan(spec), operation)
    with db_errors(operation), conn.transaction():
        return run_plan_sync(conn, enqueue_plan(spec), operation)


class Client:
    """Enqueue and read jobs through jobsd's own async pool.

    Use as ``async with Client(url) as client``; the pool opens lazily on first use too.
    """

    def __init__(
        self, database_url: str | None = None, *, settings: Settings | None = None
    ) -> None:
        self.settings = settings or Settings()
        url = database_url or self.settings.database_url
        if not url:
            from jobsd.errors import ConfigError

            raise ConfigError("no database configured: set JOBSD_DATABASE_URL")
        self._pool: AsyncPool = make_async_pool(
            url, name="client", min_size=1, max_size=self.settings.pool_size, timeout_s=2.0
        )
        self._opened = False

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _open(self) -> None:
        if not self._opened:
            await self._pool.open()
            self._opened = True

    async def close(self) -> None:
        """Close the pool."""
        if self._opened:
            await self._pool.close()
            self._opened = False

    async def enqueue(
        self,
        type: str,
        payload: dict[str, Any] | None = None,
        *,
        org_id: str,
        queue: str = "default",
        dedup_key: str | None = None,
        run_after: datetime | None = None,
        job_id: uuid.UUID | str | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        depends_on: Iterable[uuid.UUID | str] = (),
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> Job:
        """Create a job and return it, or return the existing job on a dedup or id hit.

        ``priority``: lower runs first, FIFO within a priority. ``concurrency_key``:
        jobs sharing it run at most their limit at once (1 unless the type or the
        queue says otherwise). ``depends_on``: job ids that must all succeed before
        this one runs (it is ``blocked`` until then, and fails if one fails).
        With ``conn``, the insert joins the caller's transaction and nothing is
        committed here. Raises UnknownQueue, QueueFull (nothing was inserted),
        UnknownDependency, InvalidPayload, ValueError (bad arguments),
        BackendUnavailable (no job was created) or OutcomeUnknown (retry with the
        same job id).
        """
        spec = JobSpec.build(
            type,
            payload,
            org_id=org_id,
            queue=queue,
            dedup_key=dedup_key,
            run_after=run_after,
            job_id=job_id,
            max_payload_bytes=self.settings.max_payload_bytes,
            priority=priority,
            concurrency_key=concurrency_key,
            depends_on=depends_on,
        )
        operation = f"enqueue of {type!r} into queue {queue!r}"
        if conn is not None:
            return await run_enqueue(conn, spec, operation)
        await self._open()
        sent = False
        for attempt in range(1, _CONNECTION_TRIES + 1):
            connected = False
            try:
                with db_errors(operation):
                    async with self._pool.connection() as own:
                        connected = sent = True
                        return await run_enqueue(own, spec, operation)
            except BackendUnavailable as exc:
                # No connection within the pool timeout: the pool already retried, answer now.
                if attempt == _CONNECTION_TRIES or not connected:
                    raise _final_error(spec, exc, sent) from exc.__cause__
                # Whatever happened, the same id makes the next attempt safe.
                spec = replace(spec, id_may_exist=True)
                await anyio.sleep(0.05 * attempt)
        raise AssertionError("unreachable")

    async def enqueue_many(self, specs: Sequence[JobSpec]) -> list[Job]:
        """Create many jobs in one statement; return them in order (existing ones on hits).

        All or nothing: one transaction, so an error leaves none of the jobs behind.
        Sending the same specs again (after an ambiguous failure) returns the same jobs.
        """
        if not specs:
            return []
        await self._open()
        operation = f"bulk enqueue of {len(specs)} jobs"
        with db_errors(operation):
            async with self._pool.connection() as conn, conn.transaction():
                names = sorted({s.queue for s in specs})
                found = await queries.run_named(conn, "queues_existing", {"names": names})
                missing = set(names) - {r["name"] for r in found}
                if missing:
                    raise UnknownQueue(sorted(missing)[0])
                # Jobs with dependencies take the one-by-one plan, in order, after the
                # others: they may depend on jobs of this very batch.
                plain = [s for s in specs if not s.depends_on]
                rows = await queries.run_named(conn, "jobs_insert_many", _many_params(plain))
                inserted = {r["id"]: Job.from_row(r) for r in rows}
                for spec in specs:
                    if spec.depends_on:
                        inserted[spec.id] = await run_plan(conn, enqueue_plan(spec), operation)
                result = []
                for spec in specs:
                    job = inserted.get(spec.id)
                    if job is None:  # conflict on the id or the key: resolve it like one enqueue
                        plan = enqueue_plan(replace(spec, id_may_exist=True))
                        job = await run_plan(conn, plan, operation)
                    result.append(job)
                return result

    async def get(self, job_id: uuid.UUID | str, *, org_id: str | None = None) -> Job:
        """Read a job; with ``org_id``, a job of another org is reported as not found."""
        await self._open()
        key = uuid.UUID(str(job_id))
        with db_errors(f"read of job {key}"):
            async with self._pool.connection() as conn:
                job = await queries.get_job(conn, key)
        if job is None or (org_id is not None and job.org_id != org_id):
            raise JobNotFound(job_id)
        return job

    async def events(self, job_id: uuid.UUID | str) -> list[JobEvent]:
        """Read the history of a job, oldest first."""
        await self._open()
        with db_errors(f"read of history of job {job_id}"):
            async with self._pool.connection() as conn:
                return await queries.get_job_events(conn, uuid.UUID(str(job_id)))

    # Queue administration: see jobsd.admin.queues (and docs/queues.md) for the semantics.

    async def create_queue(
        self,
        name: str,
        *,
        capacity: int | None = None,
        concurrency_limit: int | None = None,
        retention_days: int | None = None,
    ) -> QueueInfo:
        """Declare a queue; raise QueueExists if the name is taken."""
        await self._open()
        with db_errors(f"creation of queue {name!r}"):
            async with self._pool.connection() as conn:
                return await create_queue(
                    conn,
                    name,
                    capacity=capacity,
                    concurrency_limit=concurrency_limit,
                    retention_days=retention_days,
                )

    async def set_queue_limits(
        self,
        name: str,
        *,
        capacity: int | Unchanged | None = UNCHANGED,
        concurrency_limit: int | Unchanged | None = UNCHANGED,
        retention_days: int | Unchanged | None = UNCHANGED,
    ) -> QueueInfo:
        """Change the limits given (None removes one); see ``admin.queues.set_queue_limits``."""
        await self._open()
        with db_errors(f"change of the limits of queue {name!r}"):
            async with self._pool.connection() as conn:
                return await set_queue_limits(
                    conn,
                    name,
                    capacity=capacity,
                    concurrency_limit=concurrency_limit,
                    retention_days=retention_days,
                )

    async def list_queues(self) -> list[QueueInfo]:
        """Return every declared queue with its open jobs by state (every org's)."""
        await self._open()
        with db_errors("listing of the queues"):
            async with self._pool.connection() as conn:
                return await list_queues(conn)

    async def pause_queue(self, name: str) -> QueueInfo:
        """Stop claims from a queue (running jobs finish); idempotent."""
        await self._open()
        with db_errors(f"pause of queue {name!r}"):
            async with self._pool.connection() as conn:
                return await pause_queue(conn, name)

    async def resume_queue(self, name: str) -> QueueInfo:
        """Let daemons claim from a queue again, and wake them; idempotent."""
        await self._open()
        with db_errors(f"resume of queue {name!r}"):
            async with self._pool.connection() as conn:
                return await resume_queue(conn, name)

    async def drop_queue(self, name: str) -> int:
        """Delete a queue without open jobs, and its finished jobs; return how many jobs.

        Raises QueueNotEmpty (nothing deleted), UnknownQueue, ValueError for ``default``.
        """
        await self._open()
        with db_errors(f"drop of queue {name!r}"):
            async with self._pool.connection() as conn:
                return await drop_queue(conn, name)


def _final_error(spec: JobSpec, exc: BackendUnavailable, sent: bool) -> BackendUnavailable:
    if sent and spec.id_may_exist:
        return OutcomeUnknown(
            f"enqueue of job {spec.id} could not be confirmed: retry with the same job id ({exc})"
        )
    return exc


def _many_params(specs: Iterable[JobSpec]) -> dict[str, list[Any]]:
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "ids",
            "org_ids",
            "types",
            "queues",
            "dedup_keys",
            "payloads",
            "run_afters",
            "priorities",
            "concurrency_keys",
        )
    }
    for s in specs:
        cols["ids"].append(s.id)
        cols["org_ids"].append(s.org_id)
        cols["types"].append(s.type)
        cols["queues"].append(s.queue)
        cols["dedup_keys"].append(s.dedup_key)
        cols["payloads"].append(s.payload_json)
        cols["run_afters"].append(s.run_after)
        cols["priorities"].append(s.priority)
        cols["concurrency_keys"].append(s.concurrency_key)
    return cols


class SyncClient:
    """Enqueue and read jobs from synchronous code (scripts, WSGI apps, threads)."""

    def __init__(
        self, database_url: str | None = None, *, settings: Settings | None = None
    ) -> None:
        self.settings = settings or Settings()
        url = database_url or self.settings.database_url
        if not url:
            from jobsd.errors import ConfigError

            raise ConfigError("no database configured: set JOBSD_DATABASE_URL")
        self._pool: SyncPool = make_sync_pool(
            url, name="client", min_size=1, max_size=self.settings.pool_size, timeout_s=2.0
        )
        self._opened = False

    def __enter__(self) -> Self:
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> None:
        if not self._opened:
            self._pool.open()
            self._opened = True

    def close(self) -> None:
        """Close the pool."""
        if self._opened:
            self._pool.close()
            self._opened = False

    def enqueue(
        self,
        type: str,
        payload: dict[str, Any] | None = None,
        *,
        org_id: str,
        queue: str = "default",
        dedup_key: str | None = None,
        run_after: datetime | None = None,
        job_id: uuid.UUID | str | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        depends_on: Iterable[uuid.UUID | str] = (),
        conn: psycopg.Connection[Any] | None = None,
    ) -> Job:
        """Create a job; see ``Client.enqueue``."""
        spec = JobSpec.build(
            type,
            payload,
            org_id=org_id,
            queue=queue,
            dedup_key=dedup_key,
            run_after=run_after,
            job_id=job_id,
            max_payload_bytes=self.settings.max_payload_bytes,
            priority=priority,
            concurrency_key=concurrency_key,
            depends_on=depends_on,
        )
        operation = f"enqueue of {type!r} into queue {queue!r}"
        if conn is not None:
            return run_enqueue_sync(conn, spec, operation)
        self._open()
        sent = False
        for attempt in range(1, _CONNECTION_TRIES + 1):
            connected = False
            try:
                with db_errors(operation), self._pool.connection() as own:
                    connected = sent = True
                    return run_enqueue_sync(own, spec, operation)
            except BackendUnavailable as exc:
                if attempt == _CONNECTION_TRIES or not connected:
                    raise _final_error(spec, exc, sent) from exc.__cause__
                spec = replace(spec, id_may_exist=True)
                time.sleep(0.05 * attempt)
        raise AssertionError("unreachable")

    def get(self, job_id: uuid.UUID | str, *, org_id: str | None = None) -> Job:
        """Read a job; with ``org_id``, a job of another org is reported as not found."""
        self._open()
        with db_errors(f"read of job {job_id}"), self._pool.connection() as conn:
            rows = queries.run_named_sync(conn, "jobs_get", {"id": uuid.UUID(str(job_id))})
        if not rows or (org_id is not None and rows[0]["org_id"] != org_id):
            raise JobNotFound(job_id)
        return Job.from_row(rows[0])

    def events(self, job_id: uuid.UUID | str) -> list[JobEvent]:
        """Read the history of a job, oldest first."""
        self._open()
        with db_errors(f"read of history of job {job_id}"), self._pool.connection() as conn:
            rows = queries.run_named_sync(
                conn, "job_events_for_job", {"id": uuid.UUID(str(job_id))}
            )
        return [JobEvent.from_row(r) for r in rows]
