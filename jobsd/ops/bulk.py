"""Retry, cancel or resolve every job a filter matches, in one call: the bulk actions.

The filter is the jobs list's (status, type, queue, org, created ``since`` and
``until``), within the caller's scope: an org's caller acts on its own org's jobs only
(a filter naming another org matches nothing, as it lists nothing). Each action takes
only the jobs it applies to, oldest first, at most ``limit`` (1000 unless told; 10,000
at most), in one transaction:

- retry: failed jobs (or cancelled ones: ``status``) that have no retry yet. Each
  becomes a new job admitted like an enqueue: a full queue or an org's quota refuses
  it ("queue_full", "org_quota"), and the rest go on. Refused too: an ``at_most_once``
  type without ``force``, a job whose dependency has not succeeded.
- cancel: open jobs (queued, scheduled, blocked, running; or one ``status`` of them).
  A running job gets a cancel request, as the single cancel gives it; a running job
  whose cancel is requested already no longer matches.
- resolve: ``recovery_required`` jobs, settled as succeeded, failed or queued.

What was done no longer matches, so the same call again continues where the last one
stopped and does nothing more once every match is done. A refused job still matches.
Each affected job's history names the caller's actor followed by ``(bulk <id>)``, and
each call is one row of ``jobsd.bulk_actions`` (its ``id``). A ``dry_run`` counts the
jobs and changes nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypedDict, Unpack

from jobsd.models import JobStatus
from jobsd.ops.caller import Caller
from jobsd.ops.resolve import Resolution
from jobsd.store import bulk as store
from jobsd.store.bulk import BulkAnswer, BulkArgs
from jobsd.store.db import AsyncConn, SyncConn

__all__ = [
    "ACTION_STATES",
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "REFUSALS",
    "BulkAction",
    "BulkOptions",
    "BulkOutcome",
    "cancel_many",
    "cancel_many_sync",
    "check_options",
    "resolution_of",
    "resolve_many",
    "resolve_many_sync",
    "retry_many",
    "retry_many_sync",
]

DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000


class BulkAction(enum.StrEnum):
    """What a bulk call does to each job it takes."""

    RETRY = "retry"
    CANCEL = "cancel"
    RESOLVE = "resolve"


# the states each action takes (its filter's status must be one of them)
ACTION_STATES: dict[BulkAction, tuple[JobStatus, ...]] = {
    BulkAction.RETRY: (JobStatus.FAILED, JobStatus.CANCELLED),
    BulkAction.CANCEL: (
        JobStatus.QUEUED,
        JobStatus.SCHEDULED,
        JobStatus.BLOCKED,
        JobStatus.RUNNING,
    ),
    BulkAction.RESOLVE: (JobStatus.RECOVERY_REQUIRED,),
}

# why a job was refused, for people
REFUSALS: dict[str, str] = {
    "queue_full": "queue full",
    "org_quota": "org quota of open jobs reached",
    "at_most_once": "at_most_once type (retry with force)",
    "dependency": "a job it depends on has not succeeded",
    "changed": "changed meanwhile",
    "busy": "held by another transaction",
}

_DONE = {
    BulkAction.RETRY: "retried",
    BulkAction.CANCEL: "cancelled",
    BulkAction.RESOLVE: "resolved",
}


class BulkOptions(TypedDict, total=False):
    """The filter and the size of a bulk call, all optional."""

    status: JobStatus | str | None
    """Only jobs in this state (one the action applies to; a retry's default: failed)."""
    type: str | None
    """Only jobs of this type."""
    queue: str | None
    """Only jobs of this queue (it must exist)."""
    org_id: str | None
    """Only this org's jobs: an operator's choice (an org's caller acts on its own)."""
    since: datetime | None
    """Only jobs created at or after it (timezone-aware)."""
    until: datetime | None
    """Only jobs created before it (timezone-aware, after ``since``)."""
    limit: int
    """At most this many jobs, oldest first (1..10000; 1000)."""
    dry_run: bool
    """Count the jobs the call would take; change nothing."""


@dataclass(frozen=True, slots=True)
class BulkOutcome:
    """What a bulk call did: it took ``matched`` jobs (at most its limit), did
    ``done`` of them and refused the rest (``refused``: a count per reason, see
    ``REFUSALS``); ``remaining`` jobs still match afterwards (the refused ones
    included). A cancel's ``requested`` are the running jobs among ``done``, whose
    cancel it requested. ``id`` is the call's row of ``jobsd.bulk_actions`` (None for a
    dry run, which only counts: ``matched`` jobs would be taken, of ``remaining``)."""

    action: BulkAction
    matched: int
    done: int
    remaining: int
    refused: dict[str, int] = field(default_factory=dict)
    requested: int = 0
    dry_run: bool = False
    id: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the outcome as JSON values (the CLI's ``--json``, the API's answer)."""
        return {
            "id": self.id,
            "action": str(self.action),
            "dry_run": self.dry_run,
            "matched": self.matched,
            "done": self.done,
            "requested": self.requested,
            "refused": dict(self.refused),
            "remaining": self.remaining,
        }

    def summary(self) -> str:
        """Say what the call did in one line, e.g. ``2000 matched, 1500 retried, 500
        refused (queue full: 500), 500 still match``."""
        if self.dry_run:
            return f"{self.matched} would be {_DONE[self.action]}, {self.remaining} match"
        done = f"{self.done} {_DONE[self.action]}"
        if self.requested:
            done += f" ({self.requested} running: cancel requested)"
        parts = [f"{self.matched} matched", done]
        refused = sum(self.refused.values())
        if refused:
            reasons = ", ".join(f"{REFUSALS.get(k, k)}: {n}" for k, n in self.refused.items())
            parts.append(f"{refused} refused ({reasons})")
        parts.append(f"{self.remaining} still match")
        return ", ".join(parts)


def _text(name: str, value: str | None) -> str | None:
    if value is not None and not value:
        raise ValueError(f"{name} must not be empty")
    return value


def _utc(name: str, moment: datetime | None) -> datetime | None:
    """Return ``moment`` in UTC (the database takes offsets up to 15:59 only)."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        raise ValueError(f"{name} must carry a time zone (e.g. 2030-01-01T00:00:00Z)")
    try:
        return moment.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+01:00: before the year 1 in UTC
        raise ValueError(f"{name} is out of range: {moment.isoformat()}") from None


def check_options(action: BulkAction, **options: Unpack[BulkOptions]) -> tuple[dict[str, Any], int]:
    """Check a bulk call's options; return its filter (JSON values) and its limit.

    Raises ValueError naming the bad option: a limit outside 1..10000, a state the
    action does not apply to, an empty text, a time without a time zone, ``until``
    not after ``since``.
    """
    limit = options.get("limit", DEFAULT_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}, not {limit!r}")
    states = ACTION_STATES[action]
    status = options.get("status")
    if status is None and action is BulkAction.RETRY:
        status = JobStatus.FAILED
    if status is not None:
        try:
            status = JobStatus(status)
        except ValueError:
            known = ", ".join(s.value for s in JobStatus)
            raise ValueError(f"unknown status {status!r}: one of {known}") from None
        if status not in states:
            names = [str(s) for s in states]
            applies = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 2 else names)
            raise ValueError(f"a bulk {action} applies to {applies} jobs, not {status} ones")
    since, until = _utc("since", options.get("since")), _utc("until", options.get("until"))
    if since is not None and until is not None and until <= since:
        raise ValueError(f"until ({until.isoformat()}) must be after since ({since.isoformat()})")
    wanted = {
        "status": str(status) if status is not None else None,
        "type": _text("type", options.get("type")),
        "queue": _text("queue", options.get("queue")),
        "org_id": _text("org", options.get("org_id")),
        "since": since.isoformat() if since is not None else None,
        "until": until.isoformat() if until is not None else None,
    }
    return {k: v for k, v in wanted.items() if v is not None}, limit


def _args(
    action: BulkAction, caller: Caller, options: BulkOptions, extra: dict[str, Any]
) -> BulkArgs:
    wanted, limit = check_options(action, **options)
    return BulkArgs(
        actor=caller.actor,
        scope=caller.scope,
        filter=wanted,
        limit=limit,
        dry_run=bool(options.get("dry_run", False)),
        extra=extra,
    )


def _outcome(action: BulkAction, args: BulkArgs, answer: BulkAnswer) -> BulkOutcome:
    if not answer.queue_found:
        raise ValueError(f"unknown queue {args.filter.get('queue')!r}: no such queue")
    return BulkOutcome(
        action=action,
        matched=answer.matched,
        done=answer.done,
        remaining=answer.remaining,
        refused=answer.refused,
        requested=answer.requested,
        dry_run=args.dry_run,
        id=answer.bulk_id,
    )


def _retry_args(caller: Caller, force: bool, options: BulkOptions) -> BulkArgs:
    return _args(BulkAction.RETRY, caller, options, {"force": force})


async def retry_many(
    conn: AsyncConn, caller: Caller, *, force: bool = False, **options: Unpack[BulkOptions]
) -> BulkOutcome:
    """Retry the failed (or cancelled) jobs of the filter that have no retry yet, each
    as a new job admitted like an enqueue, oldest first. ``force`` retries jobs of
    ``at_most_once`` types too. Raises ValueError for a bad option or an unknown queue
    (nothing done)."""
    args = _retry_args(caller, force, options)
    return _outcome(BulkAction.RETRY, args, await store.run_bulk(conn, "bulk_retry", args))


def retry_many_sync(
    conn: SyncConn, caller: Caller, *, force: bool = False, **options: Unpack[BulkOptions]
) -> BulkOutcome:
    """Retry the jobs of the filter; see ``retry_many`` (sync)."""
    args = _retry_args(caller, force, options)
    return _outcome(BulkAction.RETRY, args, store.run_bulk_sync(conn, "bulk_retry", args))


def _cancel_args(caller: Caller, reason: str, options: BulkOptions) -> BulkArgs:
    if not reason:
        raise ValueError("a cancel needs a reason")
    return _args(BulkAction.CANCEL, caller, options, {"reason": reason})


async def cancel_many(
    conn: AsyncConn,
    caller: Caller,
    *,
    reason: str = "cancelled (bulk)",
    **options: Unpack[BulkOptions],
) -> BulkOutcome:
    """Cancel the open jobs of the filter, oldest first: at once, or by a cancel
    request for a running one (``requested``). ``reason`` is the cancelled jobs'
    reason. Raises ValueError for a bad option or an unknown queue."""
    args = _cancel_args(caller, reason, options)
    return _outcome(BulkAction.CANCEL, args, await store.run_bulk(conn, "bulk_cancel", args))


def cancel_many_sync(
    conn: SyncConn,
    caller: Caller,
    *,
    reason: str = "cancelled (bulk)",
    **options: Unpack[BulkOptions],
) -> BulkOutcome:
    """Cancel the open jobs of the filter; see ``cancel_many`` (sync)."""
    args = _cancel_args(caller, reason, options)
    return _outcome(BulkAction.CANCEL, args, store.run_bulk_sync(conn, "bulk_cancel", args))


def resolution_of(how: Resolution | str) -> Resolution:
    """Read how jobs are settled: succeeded, failed, requeue (``queued`` says the same:
    the state a requeued job is in). Raises ValueError for anything else."""
    if how == "queued":
        return Resolution.REQUEUE
    try:
        return Resolution(how)
    except ValueError:
        raise ValueError(f"resolve as succeeded, failed or requeue (queued), not {how!r}") from None


_STATUS = {
    Resolution.SUCCEEDED: JobStatus.SUCCEEDED,
    Resolution.FAILED: JobStatus.FAILED,
    Resolution.REQUEUE: JobStatus.QUEUED,
}


def _resolve_args(caller: Caller, how: Resolution | str, options: BulkOptions) -> BulkArgs:
    resolution = resolution_of(how)
    who = "an operator" if caller.operator else "its org"
    extra = {
        "status": str(_STATUS[resolution]),
        "reason": f"resolved as {resolution} by {who} (bulk)",
        "error": "resolved as failed" if resolution is Resolution.FAILED else None,
    }
    return _args(BulkAction.RESOLVE, caller, options, extra)


async def resolve_many(
    conn: AsyncConn, caller: Caller, how: Resolution | str, **options: Unpack[BulkOptions]
) -> BulkOutcome:
    """Settle the ``recovery_required`` jobs of the filter as ``how`` says (succeeded,
    failed, requeue), oldest first, as the single resolve does. Raises ValueError for a
    bad ``how`` or option, or an unknown queue."""
    args = _resolve_args(caller, how, options)
    return _outcome(BulkAction.RESOLVE, args, await store.run_bulk(conn, "bulk_resolve", args))


def resolve_many_sync(
    conn: SyncConn, caller: Caller, how: Resolution | str, **options: Unpack[BulkOptions]
) -> BulkOutcome:
    """Settle the recovery_required jobs of the filter; see ``resolve_many`` (sync)."""
    args = _resolve_args(caller, how, options)
    return _outcome(BulkAction.RESOLVE, args, store.run_bulk_sync(conn, "bulk_resolve", args))
