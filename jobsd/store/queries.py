"""One typed function per named statement of ``sql/queries/jobs.sql``: jobs and their history.

Connections may be jobsd's own (dict rows) or a caller's (any row factory): every
function opens its own dict-row cursor. Errors are translated here, with
``db_errors``, once per function, naming the operation and the id.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from jobsd.errors import AlreadyClaimed, DatabaseError, JobNotFound
from jobsd.jsonsafe import ERROR_RECORDS_KEPT, cap_error, error_record, storable_json
from jobsd.models import STATUS_BY_VALUE, Job, JobEvent, JobStatus
from jobsd.store.db import AsyncConn, SyncConn, db_errors

# run_named: re-exported for the tests that insert raw rows; code outside jobsd.store
# calls the typed functions.
from jobsd.store.named import run_named as run_named
from jobsd.store.named import run_named_sync, run_named_tuples

__all__ = [
    "ClaimRound",
    "DeadSweep",
    "FinishRow",
    "Finished",
    "HeartbeatRow",
    "PromoteResult",
    "RescueCandidate",
    "RescueDecider",
    "RescueVerdict",
    "Started",
    "claim_batch",
    "claim_job",
    "db_now",
    "finish_batch",
    "get_job",
    "get_job_events",
    "get_job_events_sync",
    "get_job_sync",
    "heartbeat_v2",
    "note_discarded",
    "owned_unheld",
    "prepare_claim",
    "promote_due",
    "release_reserved",
    "rescue_apply_params",
    "rescue_params",
    "resolve_job",
    "start_reserved",
    "sweep_dead_workers",
    "sweep_stale",
]


async def get_job(conn: AsyncConn, job_id: uuid.UUID) -> Job | None:
    """Read one job, or None."""
    with db_errors(f"read of job {job_id}"):
        rows = await run_named(conn, "jobs_get", {"id": job_id})
    return Job.from_row(rows[0]) if rows else None


def get_job_sync(conn: SyncConn, job_id: uuid.UUID) -> Job | None:
    """Read one job, or None (sync)."""
    with db_errors(f"read of job {job_id}"):
        rows = run_named_sync(conn, "jobs_get", {"id": job_id})
    return Job.from_row(rows[0]) if rows else None


async def get_job_events(conn: AsyncConn, job_id: uuid.UUID) -> list[JobEvent]:
    """Read the history of one job, oldest first."""
    with db_errors(f"read of history of job {job_id}"):
        rows = await run_named(conn, "job_events_for_job", {"id": job_id})
    return [JobEvent.from_row(r) for r in rows]


def get_job_events_sync(conn: SyncConn, job_id: uuid.UUID) -> list[JobEvent]:
    """Read the history of one job, oldest first (sync)."""
    with db_errors(f"read of history of job {job_id}"):
        rows = run_named_sync(conn, "job_events_for_job", {"id": job_id})
    return [JobEvent.from_row(r) for r in rows]


class ClaimRound(list[Job]):
    """The jobs of one claim, in claim order; a list, with what the round saw.

    ``left_for_busy_keys``: the round started fewer jobs than it could because some
    candidates shared a concurrency key with jobs it started. Claiming again at once
    finds those keys at their limit and the next jobs behind them.
    """

    def __init__(self, jobs: list[Job], *, left_for_busy_keys: bool = False) -> None:
        super().__init__(jobs)
        self.left_for_busy_keys = left_for_busy_keys


# jobs_claim_batch returns a Job's 23 columns, then `considered`
_CLAIM_CONSIDERED = 23


async def claim_batch(
    conn: AsyncConn,
    *,
    limit: int,
    worker_id: str,
    queues: Sequence[str] | None,
    keep_dedup_types: Sequence[str],
    key_limits: Mapping[str, int] | None = None,
    free: int | None = None,
    types: Sequence[str] | None = None,
    at_most_once_types: Sequence[str] = (),
    durable: bool = False,
    reserve_s: float = 2.0,
) -> ClaimRound:
    """Claim up to ``limit`` queued jobs in claim order, in one statement.

    ``key_limits`` maps job types to their per-key concurrency limit (types not in
    it use their queue's limit, else 1). ``free`` (None: ``limit``) is how many of them
    start at once (``running``); the others are reserved for ``reserve_s`` (still
    ``queued``, nothing charged: ``start_reserved`` starts them) and are only jobs
    without a dedup or concurrency key, not of ``at_most_once_types`` and not in a
    queue with an org running limit. ``types``: claim only jobs of these types (the
    daemon's handlers); None claims every type. Unless ``durable``, or one of the jobs
    is of an at-most-once type or has a concurrency key, the claim commits without
    waiting for the disk (docs/decisions.md).
    """
    params = _claim_params(
        limit, worker_id, queues, keep_dedup_types, key_limits, free, types,
        at_most_once_types, durable, reserve_s,
    )  # fmt: skip
    with db_errors(f"claim failed for worker {worker_id!r}"):
        rows = await run_named_tuples(conn, "jobs_claim_batch", params)
    jobs = [Job.from_fields(r) for r in rows]
    jobs.sort(key=lambda j: (j.priority, j.created_at, j.id))
    considered = int(rows[0][_CLAIM_CONSIDERED]) if rows else 0
    busy = bool(jobs) and len(jobs) < limit and considered > len(jobs)
    return ClaimRound(jobs, left_for_busy_keys=busy)


# No job has this type: a job type is at most 200 characters (the jobs_type_size check).
_NO_SUCH_TYPE = "?" * 201
# Postgres plans a prepared statement afresh for its first five runs, then settles on
# its generic plan when that is no dearer: the sixth run is the first without planning.
CLAIM_PREPARE_RUNS = 6


async def prepare_claim(
    conn: AsyncConn,
    *,
    limit: int,
    worker_id: str,
    queues: Sequence[str] | None,
    keep_dedup_types: Sequence[str],
    key_limits: Mapping[str, int] | None = None,
    free: int | None = None,
    at_most_once_types: Sequence[str] = (),
    durable: bool = False,
    reserve_s: float = 2.0,
) -> None:
    """Prepare the claim on ``conn`` and run it past Postgres's planning, claiming nothing.

    The arguments are those of the claims to come (``claim_batch``): psycopg keys a
    prepared statement by its parameters' types, and Postgres weighs its generic plan
    against the plans it made for them. Only the types differ: one no job can have, so
    no row is read for update, locked or written. Without this, a connection's first
    ten claims are planned, each taking twice as long as a planned one.
    """
    params = _claim_params(
        limit, worker_id, queues, keep_dedup_types, key_limits, free, [_NO_SUCH_TYPE],
        at_most_once_types, durable, reserve_s,
    )  # fmt: skip
    with db_errors(f"claim preparation for worker {worker_id!r}"):
        for _ in range(CLAIM_PREPARE_RUNS):
            await run_named_tuples(conn, "jobs_claim_batch", params, prepare=True)


def _claim_params(
    limit: int,
    worker_id: str,
    queues: Sequence[str] | None,
    keep_dedup_types: Sequence[str],
    key_limits: Mapping[str, int] | None,
    free: int | None,
    types: Sequence[str] | None,
    at_most_once_types: Sequence[str],
    durable: bool,
    reserve_s: float,
) -> dict[str, Any]:
    limits = dict(key_limits or {})
    return {
        "limit": limit,
        "worker_id": worker_id,
        "queues": list(queues) if queues else None,
        "keep_dedup_types": list(keep_dedup_types),
        "limit_types": list(limits),
        "limit_values": list(limits.values()),
        "free": free,
        "types": list(types) if types is not None else None,
        "at_most_once_types": list(at_most_once_types),
        "relaxed_commit": not durable,
        "reserve_s": reserve_s,
    }


@dataclass(frozen=True, slots=True)
class HeartbeatRow:
    """One held job in a heartbeat: its lease and the progress fields not yet written."""

    job_id: uuid.UUID
    lease_id: uuid.UUID
    fields: dict[str, Any] | None


async def heartbeat_v2(conn: AsyncConn, rows: Sequence[HeartbeatRow]) -> dict[uuid.UUID, bool]:
    """Stamp and merge progress for held jobs; map each id whose lease still holds to
    whether a cancel request waits for it."""
    if not rows:
        return {}
    params = {
        "ids": [r.job_id for r in rows],
        "lease_ids": [r.lease_id for r in rows],
        # one job's odd progress text must not fail the heartbeat of every other job
        "fields": [storable_json(r.fields) if r.fields else None for r in rows],
    }
    with db_errors(f"heartbeat of {len(rows)} jobs"):
        result = await run_named(conn, "jobs_heartbeat", params)
    return {r["id"]: bool(r["cancel_requested"]) for r in result}


@dataclass(frozen=True, slots=True)
class Started:
    """A reserved job's start, as written: its attempt (this run's) and start time."""

    attempts: int
    started_at: datetime


async def start_reserved(
    conn: AsyncConn,
    runs: Sequence[tuple[uuid.UUID, uuid.UUID, uuid.UUID]],
    *,
    durable: bool = False,
    confirm: bool = False,
) -> dict[uuid.UUID, Started]:
    """Start reserved jobs: (id, reservation's lease id, the run's new lease id) each.
    Return the ids started, with their attempt; a job whose reservation is gone is not
    started. ``confirm`` also returns the ones an earlier try with the same leases
    started (its answer lost)."""
    if not runs:
        return {}
    params = {
        "ids": [r[0] for r in runs],
        "lease_ids": [r[1] for r in runs],
        "new_lease_ids": [r[2] for r in runs],
        "relaxed": not durable,
        "confirm": confirm,
    }
    with db_errors(f"start of {len(runs)} reserved jobs"):
        rows = await run_named_tuples(conn, "jobs_start_reserved", params)
    return {r[0]: Started(r[1], r[2]) for r in rows}


async def release_reserved(
    conn: AsyncConn, reservations: Sequence[tuple[uuid.UUID, uuid.UUID]]
) -> set[uuid.UUID]:
    """Give back reservations (id, lease id) without starting them; return the ids
    released (the others were no longer this reservation's)."""
    if not reservations:
        return set()
    params = {"ids": [r[0] for r in reservations], "lease_ids": [r[1] for r in reservations]}
    with db_errors(f"release of {len(reservations)} reserved jobs"):
        rows = await run_named_tuples(conn, "jobs_release_reserved", params)
    return {r[0] for r in rows}


async def owned_unheld(conn: AsyncConn, worker_id: str, held: Sequence[uuid.UUID]) -> list[Job]:
    """Return the running jobs of ``worker_id`` whose lease is not in ``held``: the
    jobs of a claim whose answer was lost."""
    with db_errors(f"read of the running jobs of worker {worker_id!r}"):
        rows = await run_named_tuples(
            conn, "jobs_owned_unheld", {"worker_id": worker_id, "held": list(held)}
        )
    return [Job.from_fields(r) for r in rows]


@dataclass(frozen=True, slots=True)
class FinishRow:
    """The outcome of one run, ready to write: status, report and error as stored."""

    job_id: uuid.UUID
    lease_id: uuid.UUID
    status: str
    report_json: str | None
    error: str | None
    reason: str | None
    progress: dict[str, Any] | None
    run_after: datetime | None = None
    delay_s: float | None = None
    error_record: dict[str, Any] | None = None
    """the attempt's error record (``jsonsafe.error_record``), for an outcome with an
    error; None writes none (a success)"""


@dataclass(frozen=True, slots=True)
class Finished:
    """What a written outcome left in a job's row (the rest is as the claim returned it)."""

    id: uuid.UUID
    type: str
    status: JobStatus
    concurrency_key: str | None
    dedup_key: str | None
    lease_id: uuid.UUID | None
    error: str | None
    reason: str | None
    progress: dict[str, Any] | None
    finished_at: datetime | None
    run_after: datetime

    def applied_to(self, job: Job, report_json: str | None) -> Job:
        """Return ``job`` (as claimed) with this outcome applied, ``report_json`` its report."""
        return replace(
            job,
            status=self.status,
            dedup_key=self.dedup_key,
            lease_id=self.lease_id,
            error=self.error,
            reason=self.reason,
            progress=self.progress,
            finished_at=self.finished_at,
            run_after=self.run_after,
            report=json.loads(report_json) if report_json else job.report,
        )


async def finish_batch(
    conn: AsyncConn,
    rows: Sequence[FinishRow],
    *,
    before_commit: Callable[[], object] | None = None,
    confirm: bool = False,
) -> dict[uuid.UUID, Finished]:
    """Write many outcomes in one statement; return what each written one became, by id.

    An id missing from the result had lost its lease: that outcome was discarded.
    ``before_commit`` (a fault point) runs after the statement, inside its transaction.
    ``confirm`` (the same outcomes again, after an answer that never came) also returns
    the ones an earlier try wrote.
    """
    if not rows:
        return {}
    params = {
        "results": _results_json(rows),
        "confirm": confirm,
        "errors_kept": ERROR_RECORDS_KEPT,
    }
    with db_errors(f"finish of {len(rows)} jobs"):
        result = await _run_before_commit(conn, "jobs_finish_batch", params, before_commit)
    # RETURNING holds Finished's fields in their order
    return {r[0]: Finished(r[0], r[1], STATUS_BY_VALUE[r[2]], *r[3:]) for r in result}


async def _run_before_commit(
    conn: AsyncConn, name: str, params: dict[str, Any], before_commit: Callable[[], object] | None
) -> list[tuple[Any, ...]]:
    if before_commit is None:
        return await run_named_tuples(conn, name, params)
    async with conn.transaction():
        result = await run_named_tuples(conn, name, params)
        before_commit()
    return result


def _results_json(rows: Sequence[FinishRow]) -> str:
    """Return the outcomes as the JSON array jobsd.outcome_rows reads."""
    # Reports were serialized (and checked) once by the executor; splice them in as
    # raw JSON so they are not parsed and dumped again on the hot path.
    parts = []
    for r in rows:
        # an error message may hold NUL or lone surrogates (from a file name, say):
        # replaced, so that one outcome cannot fail the write of the whole batch
        fields = {
            "id": str(r.job_id),
            "lease_id": str(r.lease_id),
            "status": r.status,
            "error": _cap(r.error),
            "reason": r.reason,
            "progress": r.progress,
            "run_after": r.run_after.isoformat() if r.run_after else None,
            "delay_s": r.delay_s,
        }
        if r.error_record is not None:  # a success has none: not even the key
            fields["error_record"] = r.error_record
        head = storable_json(fields)
        parts.append(f'{head[:-1]},"report":{r.report_json or "null"}}}')
    return f"[{','.join(parts)}]"


def _cap(error: str | None) -> str | None:
    """Fit an error to the column (the executor marked a cut already; see ``cap_error``)."""
    return cap_error(error, mark=False) if error is not None else None


@dataclass(frozen=True, slots=True)
class RescueCandidate:
    """A running job a rescue pass locked: what deciding its fate needs."""

    id: uuid.UUID
    type: str
    attempts: int
    cancel_requested: bool
    dead: bool
    """its owner is dead (else unresponsive)"""


@dataclass(frozen=True, slots=True)
class RescueVerdict:
    """What a rescued job becomes: the daemon's decision, written as it is."""

    status: str
    reason: str
    error: str | None = None
    """the cause kept in ``error``; None keeps the job's own"""


RescueDecider = Callable[[RescueCandidate], RescueVerdict]
"""decides a rescued job's fate (``worker/decide.py``): the statements hold no rule"""


def rescue_params(
    *,
    stale_after_s: float | None = None,
    now: datetime | None = None,
    dead_workers: Sequence[str] = (),
    only: uuid.UUID | None = None,
) -> dict[str, Any]:
    """Return the parameters of ``jobs_rescue_candidates``."""
    return {
        "now": now,
        "only": only,
        "stale_after_s": stale_after_s,
        "dead_workers": list(dead_workers),
    }


def rescue_apply_params(rows: Sequence[Mapping[str, Any]], decide: RescueDecider) -> dict[str, Any]:
    """Decide the fate of each row of ``jobs_rescue_candidates``; return the parameters
    of ``jobs_rescue_apply`` that write it, with the error record of each lost attempt
    (cause ``worker lost``, whatever the job becomes)."""
    candidates = [
        RescueCandidate(r["id"], r["type"], r["attempts"], r["cancel_requested"], r["dead"])
        for r in rows
    ]
    verdicts = [decide(c) for c in candidates]
    return {
        "ids": [c.id for c in candidates],
        "statuses": [v.status for v in verdicts],
        "reasons": [v.reason for v in verdicts],
        "errors": [_cap(v.error) for v in verdicts],
        "records": [
            storable_json(error_record(v.error or _lost(c), cause="worker lost"))
            for c, v in zip(candidates, verdicts, strict=True)
        ],
        "errors_kept": ERROR_RECORDS_KEPT,
    }


def _lost(job: RescueCandidate) -> str:
    """Say how a rescued job's attempt ended, when its verdict names no error (it runs
    again, or was cancelled)."""
    owner = "owner died" if job.dead else "owner unresponsive"
    return f"worker lost: {owner} at attempt {job.attempts}"


async def _rescue(
    conn: AsyncConn, worker_id: str, decide: RescueDecider, params: dict[str, Any]
) -> list[Job]:
    """Lock the candidates, decide, write; inside the caller's transaction."""
    await run_named(conn, "admin_set_actor", {"worker_id": worker_id})
    rows = await run_named(conn, "jobs_rescue_candidates", params)
    if not rows:
        return []
    written = await run_named(conn, "jobs_rescue_apply", rescue_apply_params(rows, decide))
    return [Job.from_row(r) for r in written]


async def db_now(conn: AsyncConn) -> datetime:
    """Return the database's ``now()``."""
    with db_errors("reading the database's clock"):
        rows = await run_named(conn, "jobs_db_now", {})
    now: datetime = rows[0]["now"]
    return now


async def sweep_stale(
    conn: AsyncConn,
    *,
    worker_id: str,
    stale_after_s: float,
    decide: RescueDecider,
    now: datetime | None = None,
    only: uuid.UUID | None = None,
) -> list[Job]:
    """Rescue the running jobs of unresponsive owners as ``decide`` says (``only``:
    that job alone, if it is one of them)."""
    params = rescue_params(stale_after_s=stale_after_s, now=now, only=only)
    with db_errors(f"sweep by worker {worker_id!r}"):
        async with conn.transaction():
            return await _rescue(conn, worker_id, decide, params)


async def stale_jobs(
    conn: AsyncConn, *, stale_after_s: float, now: datetime | None = None
) -> list[tuple[uuid.UUID, uuid.UUID | None]]:
    """Return the (id, lease id) of every running job whose heartbeat is stale."""
    with db_errors("list of stale jobs"):
        rows = await run_named(
            conn, "jobs_stale_list", {"stale_after_s": stale_after_s, "now": now}
        )
    return [(r["id"], r["lease_id"]) for r in rows]


@dataclass(frozen=True, slots=True)
class DeadSweep:
    """Workers found dead (their lock was free) and their jobs as rescued."""

    dead_workers: list[str]
    jobs: list[Job]


async def sweep_dead_workers(
    conn: AsyncConn, *, worker_id: str, decide: RescueDecider
) -> DeadSweep:
    """Take the lock of every dead registered worker, rescue its jobs as ``decide``
    says, delete its row.

    One transaction: the locks are transaction-scoped, so no other sweeper can act on
    the same worker meanwhile, and the commit releases them.
    """
    with db_errors(f"death check by worker {worker_id!r}"):
        async with conn.transaction():
            found = await run_named(conn, "workers_take_dead", {"worker_id": worker_id})
            dead = [r["worker_id"] for r in found]
            if not dead:
                return DeadSweep([], [])
            jobs = await _rescue(conn, worker_id, decide, rescue_params(dead_workers=dead))
            await run_named(conn, "workers_delete_many", {"worker_ids": dead})
    return DeadSweep(dead, jobs)


@dataclass(frozen=True, slots=True)
class PromoteResult:
    """How many scheduled jobs became queued, and when the next one is due."""

    promoted: int
    next_due: datetime | None
    next_due_in_s: float | None = None
    """seconds from the statement's ``now`` to ``next_due``, on the database's clock"""


async def promote_due(
    conn: AsyncConn, *, limit: int = 1000, now: datetime | None = None
) -> PromoteResult:
    """Move due scheduled jobs to queued."""
    with db_errors("promotion of due scheduled jobs"):
        rows = await run_named(conn, "jobs_promote_due", {"limit": limit, "now": now})
    row = rows[0]
    return PromoteResult(
        promoted=row["promoted"], next_due=row["next_due"], next_due_in_s=row["next_due_in_s"]
    )


async def note_discarded(conn: AsyncConn, job_ids: Sequence[uuid.UUID], *, worker_id: str) -> None:
    """Record in each job's history that ``worker_id``'s result for it was discarded."""
    if not job_ids:
        return
    with db_errors(f"note of {len(job_ids)} discarded results"):
        await run_named(
            conn, "job_events_note_discarded", {"ids": list(job_ids), "worker_id": worker_id}
        )


async def claim_job(
    conn: AsyncConn,
    job_id: uuid.UUID,
    worker_id: str,
    *,
    keep_dedup: bool = False,
    key_limit: int | None = None,
) -> Job:
    """Claim one specific queued job under a fresh lease and return it.

    Two workers claiming the same id: one gets it, the other ``AlreadyClaimed``, never
    silence. A job that is not queued for another reason raises ``AlreadyClaimed``
    too when it is running, else ``JobNotFound`` (missing) or ``DatabaseError``
    naming its status.
    """
    params = {
        "id": job_id,
        "worker_id": worker_id,
        "keep_dedup": keep_dedup,
        "key_limit": key_limit,
    }
    with db_errors(f"claim of job {job_id} by worker {worker_id!r}"):
        rows = await run_named(conn, "jobs_claim_one", params)
        if rows:
            return Job.from_row(rows[0])
        rows = await run_named(conn, "jobs_get", {"id": job_id})
    if not rows:
        raise JobNotFound(job_id)
    job = Job.from_row(rows[0])
    if job.status == "running":
        raise AlreadyClaimed(
            f"job {job_id} is already claimed by worker {job.worker_id!r} (attempt {job.attempts})"
        )
    if job.status == "queued":
        raise DatabaseError(
            f"claim of job {job_id} refused: its queue {job.queue!r} is paused or its "
            f"concurrency key {job.concurrency_key!r} is at its limit"
        )
    raise DatabaseError(f"claim of job {job_id} failed: it is {job.status}, not queued")


async def resolve_job(
    conn: AsyncConn,
    job_id: uuid.UUID,
    *,
    status: str,
    reason: str,
    actor: str,
    report: dict[str, Any] | None = None,
    error: str | None = None,
) -> Job | None:
    """Settle a ``recovery_required`` job as ``succeeded``, ``failed`` or ``queued``.

    Return the job as written, or None when it was not ``recovery_required``.
    """
    params = {
        "id": job_id,
        "status": status,
        "reason": reason,
        "report": storable_json(report) if report is not None else None,
        "error": _cap(error),
        "org_id": None,
    }
    with db_errors(f"resolve of job {job_id}"):
        async with conn.transaction():
            await run_named(conn, "admin_set_actor", {"worker_id": actor})
            rows = await run_named(conn, "jobs_resolve", params)
    return Job.from_row(rows[0]) if rows else None
