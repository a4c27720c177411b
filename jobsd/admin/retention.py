"""Delete terminal jobs older than their retention policy (``jobsd prune``).

The policy of a job, first match wins: its type is spared (never deleted); its type has
a retention (``type_retention``); its queue has one (``jobsd.queues.retention_days``);
else it is kept forever. A job goes when it is terminal (succeeded, failed, cancelled)
and finished more than that many days (of 24 hours) before the prune started. Its
``job_events`` and ``job_dependencies`` rows go with it (ON DELETE CASCADE).

How candidates are found. Job ids are UUIDv7: their first 48 bits are the creation
time in milliseconds, and a job that finished before a cutoff was created before it.
The prune walks the primary key in id order, ``batch_size`` index entries per
statement, each statement starting where the last one stopped: one pass over the
walked ranges, however many batches, and no statement reads more than ``batch_size``
rows. It skips the ids of jobs created between the newest cutoff (plus an hour of
clock skew) and now (plus an hour): none of them can be due. Ids outside that window
are all walked, so a job whose id was chosen by a client out of time order (a UUIDv4,
say) is found too, at worst one retention period late, never early; ``full_scan``
walks every id.

Each batch of candidates is deleted in its own short transaction, with ``FOR UPDATE
SKIP LOCKED``: a concurrent prune, or an insert whose foreign key names the job, is
never waited for; what is skipped goes on the next run. Running daemons never touch a
terminal job. Idempotent: a second prune finds what the first left.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from jobsd.errors import ConfigError
from jobsd.store import archive
from jobsd.store import retention as store
from jobsd.store.db import AsyncConn, AsyncPool

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "MAX_BATCH_SIZE",
    "PruneReport",
    "prune",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_BATCH_SIZE = 5000
MAX_BATCH_SIZE = 100_000
# How far the clock that made a job id may be ahead of the database's, and still the
# job is found on time.
ID_CLOCK_SKEW = timedelta(hours=1)

_MIN_ID = uuid.UUID(int=0)
_MAX_ID = uuid.UUID(int=(1 << 128) - 1)
_OLDEST = datetime(1, 1, 2, tzinfo=UTC)
# dependency edges and on_fail records of dropped jobs deleted per statement
_ORPHANS_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What a prune deleted (or, in a dry run, would delete), per queue."""

    deleted: dict[str, int]
    dry_run: bool
    seconds: float
    now: datetime
    """The time the policy was measured from (the database's clock at the start)."""
    batches: int = 0
    """Statements that read the primary key (each at most ``batch_size`` rows)."""
    scanned: int = 0
    """Index entries read: the cost of the prune."""
    queue_retention: dict[str, int | None] = field(default_factory=dict)
    type_retention: dict[str, int] = field(default_factory=dict)
    spare_types: tuple[str, ...] = ()
    months_dropped: tuple[datetime, ...] = ()
    """Months of the archive dropped whole (or, in a dry run, that would be)."""
    default_retention: int | None = None

    @property
    def total(self) -> int:
        """Return the jobs deleted (or due, in a dry run) over all queues."""
        return sum(self.deleted.values())

    def to_json(self) -> dict[str, Any]:
        """Return the report as JSON-ready data."""
        return {
            "dry_run": self.dry_run,
            "now": self.now.isoformat(),
            "deleted": dict(self.deleted),
            "total": self.total,
            "seconds": round(self.seconds, 3),
            "batches": self.batches,
            "scanned": self.scanned,
            "queue_retention_days": dict(self.queue_retention),
            "type_retention_days": dict(self.type_retention),
            "spare_types": list(self.spare_types),
            "default_retention_days": self.default_retention,
            "months_dropped": [f"{m:%Y-%m}" for m in self.months_dropped],
        }


async def prune(
    target: AsyncConn | AsyncPool,
    *,
    spare_types: Iterable[str] = (),
    type_retention: Mapping[str, int] | None = None,
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    now: datetime | None = None,
    full_scan: bool = False,
    default_days: int | None = None,
    lock_timeout_s: float = 5.0,
) -> PruneReport:
    """Delete terminal jobs older than their policy, one short transaction per batch.

    ``target`` is a pool or a connection outside any transaction (autocommit or idle):
    each batch commits on its own. ``type_retention`` maps a type to days (>= 0) and
    overrides its queue's policy, also in queues that keep jobs forever; a spared type
    is never deleted. ``now`` pins the clock (tests); by default the database's.
    ``full_scan`` reads every id, also those of recently created jobs (see the module
    docstring): for jobs whose ids are younger than they are (imported, say).
    ``default_days`` (``JOBSD_RETENTION``) is the retention of the jobs whose type and
    queue have none (None: forever). A month of the archive whose every job is due
    is dropped whole, waiting at most ``lock_timeout_s`` for its readers.
    The role must see every org's jobs: the owner role or a superuser.
    """
    spared = _check_types(spare_types)
    by_type = _check_type_retention(type_retention or {})
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise ConfigError(f"batch size must be a whole number, got {batch_size!r}")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ConfigError(f"batch size must be between 1 and {MAX_BATCH_SIZE}, got {batch_size}")
    if now is not None and now.tzinfo is None:
        raise ConfigError("now must be timezone-aware")
    if default_days is not None and (
        isinstance(default_days, bool) or not isinstance(default_days, int) or default_days < 0
    ):
        raise ConfigError(f"retention must be a whole number of days >= 0, got {default_days!r}")
    rules = _Rules(spared, by_type, default_days, lock_timeout_s)
    async with store.connection_of(target, "prune") as conn:
        return await _prune(conn, rules, dry_run, batch_size, now, full_scan)


def _check_types(types: Iterable[str]) -> tuple[str, ...]:
    if isinstance(types, str):
        raise ConfigError("spare_types must be a collection of type names, not one string")
    names = tuple(dict.fromkeys(types))
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"a spared type must be a non-empty name, got {name!r}")
    return names


def _check_type_retention(given: Mapping[str, int]) -> dict[str, int]:
    checked: dict[str, int] = {}
    for name, days in given.items():
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"a type retention needs a non-empty type name, got {name!r}")
        if isinstance(days, bool) or not isinstance(days, int) or days < 0:
            raise ConfigError(
                f"retention of type {name!r} must be a whole number of days >= 0, got {days!r}"
            )
        checked[name] = days
    return checked


@dataclass(frozen=True, slots=True)
class _Rules:
    """What the caller asked for: spared types, types' retentions, the default one."""

    spared: tuple[str, ...]
    by_type: dict[str, int]
    default_days: int | None
    lock_timeout_s: float


async def _prune(
    conn: AsyncConn,
    rules: _Rules,
    dry_run: bool,
    batch_size: int,
    now: datetime | None,
    full_scan: bool,
) -> PruneReport:
    if store.in_transaction(conn):
        raise ConfigError("prune commits each batch on its own: call it outside a transaction")
    started = time.perf_counter()
    spared, by_type = rules.spared, rules.by_type
    policies = await store.read_policies(conn, now)
    _check_role(policies, dry_run)
    clock = policies.now
    by_queue = policies.queues
    # a spared type's retention never applies: leave it out of the cutoffs
    effective_types = {t: d for t, d in by_type.items() if t not in spared}
    # a queue without a retention of its own keeps its jobs for the default one, if any
    queue_days = {q: d if d is not None else rules.default_days for q, d in by_queue.items()}
    queue_cutoffs = {q: _cutoff(clock, d) for q, d in queue_days.items() if d is not None}
    type_cutoffs = {t: _cutoff(clock, d) for t, d in effective_types.items()}
    params: dict[str, Any] = {
        "spare_types": list(spared),
        "types": list(type_cutoffs),
        "type_cutoffs": list(type_cutoffs.values()),
        "queues": list(queue_cutoffs),
        "queue_cutoffs": list(queue_cutoffs.values()),
        "limit": batch_size,
    }
    counts: Counter[str] = Counter({q: 0 for q in by_queue})
    batches = scanned = 0
    newest = max([*queue_cutoffs.values(), *type_cutoffs.values()], default=None)
    policy = _Policy(spared, type_cutoffs, queue_cutoffs)
    dropped: list[datetime] = []
    if newest is not None:
        kept = []
        for month in await _alone(conn, archive.months(conn)):
            if policy.whole_month_due(month):
                dropped.append(month.month)
                for queue, _type, jobs in month.contents:
                    counts[queue] += jobs
                if not dry_run:
                    await _drop_month(conn, month, rules.lock_timeout_s)
            else:
                kept.append(month)
        for month in kept:
            until = min(_month_end(month.month), newest)
            if month.month >= until or not policy.may_hold_due(month):
                continue
            walked = await _prune_archive_month(
                conn, params, month.month, until, batch_size, dry_run, counts
            )
            batches += walked[0]
            scanned += walked[1]
        if dropped and not dry_run:
            await _forget_orphans(conn, before=max(_month_end(m) for m in dropped))
    for low, high in _id_ranges(newest, clock, full_scan):
        start: uuid.UUID | None = low
        while start is not None:
            batch = await store.scan_batch(conn, params, start, high)
            batches += 1
            scanned += batch.scanned
            if batch.ids:
                if dry_run:
                    counts.update(batch.queues)
                else:
                    counts.update(await store.delete_batch(conn, batch.ids))
            log.debug(
                "retention.batch",
                extra={"scanned": batch.scanned, "due": len(batch.ids), "dry_run": dry_run},
            )
            start = _next_start(batch.last_id, batch.scanned, batch_size, high)
    report = PruneReport(
        deleted=dict(sorted(counts.items())),
        dry_run=dry_run,
        seconds=time.perf_counter() - started,
        now=clock,
        batches=batches,
        scanned=scanned,
        queue_retention=by_queue,
        type_retention=by_type,
        spare_types=spared,
        months_dropped=tuple(dropped),
        default_retention=rules.default_days,
    )
    if report.total and not dry_run:
        log.info(
            "retention.pruned",
            extra={
                "deleted": report.total,
                "per_queue": report.deleted,
                "duration_s": round(report.seconds, 3),
            },
        )
    return report


def _check_role(policies: store.Policies, dry_run: bool) -> None:
    role = policies.role
    if policies.rls_active:
        raise ConfigError(
            f"role {role!r} is subject to row-level security on jobsd.jobs and would see "
            "one org's jobs only: prune as the owner role (jobsd roles create) or a superuser"
        )
    if not dry_run and not policies.may_delete:
        raise ConfigError(
            f"role {role!r} may not delete from jobsd.jobs: "
            "prune as the owner role (jobsd roles create) or a superuser"
        )


def _cutoff(now: datetime, days: int) -> datetime:
    """Return ``now`` minus ``days`` of 24 hours (the year 1 for absurdly long policies)."""
    try:
        return max(now - timedelta(days=days), _OLDEST)
    except OverflowError:
        return _OLDEST


def _id_ranges(
    newest_cutoff: datetime | None, now: datetime, full_scan: bool = False
) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """Return the id ranges (inclusive) where due jobs can be: all but the recent ids.

    No policy at all: nothing. A full scan: every id. Otherwise every id except the
    UUIDv7 ids made after the newest cutoff and before now (both plus the allowed
    clock skew).
    """
    if newest_cutoff is None:
        return []
    if full_scan:
        return [(_MIN_ID, _MAX_ID)]
    low_end = _v7_last(newest_cutoff + ID_CLOCK_SKEW)
    high_start = _v7_first(now + ID_CLOCK_SKEW)
    if low_end.int + 1 >= high_start.int:
        return [(_MIN_ID, _MAX_ID)]
    return [(_MIN_ID, low_end), (high_start, _MAX_ID)]


def _unix_ms(moment: datetime) -> int:
    return max(0, int(moment.timestamp() * 1000))


def _v7_first(moment: datetime) -> uuid.UUID:
    """Return the smallest id of the millisecond ``moment`` falls in."""
    return uuid.UUID(int=_unix_ms(moment) << 80)


def _v7_last(moment: datetime) -> uuid.UUID:
    """Return the largest id of the millisecond ``moment`` falls in."""
    return uuid.UUID(int=((_unix_ms(moment) + 1) << 80) - 1)


def _next_start(
    last_id: uuid.UUID | None, scanned: int, batch_size: int, high: uuid.UUID
) -> uuid.UUID | None:
    """Return where the next batch starts, or None when the range is read to its end."""
    if last_id is None or scanned < batch_size or last_id.int >= high.int:
        return None
    return uuid.UUID(int=last_id.int + 1)


@dataclass(frozen=True, slots=True)
class _Policy:
    """The cutoffs of one prune, asked about whole months of the archive."""

    spared: tuple[str, ...]
    type_cutoffs: dict[str, datetime]
    queue_cutoffs: dict[str, datetime]

    def cutoff(self, queue: str, type: str) -> datetime | None:
        """Return when a job of ``queue`` and ``type`` must have ended to be due (None:
        never)."""
        if type in self.spared:
            return None
        return self.type_cutoffs.get(type, self.queue_cutoffs.get(queue))

    def whole_month_due(self, month: archive.ArchiveMonth) -> bool:
        """Say whether every job of ``month`` is due: it holds some, and each of its
        (queue, type) pairs has a cutoff after the month's end."""
        end = _month_end(month.month)
        if not month.contents:
            return False
        for queue, type, _jobs in month.contents:
            cutoff = self.cutoff(queue, type)
            if cutoff is None or cutoff < end:
                return False
        return True

    def may_hold_due(self, month: archive.ArchiveMonth) -> bool:
        """Say whether some job of ``month`` may be due: one of its pairs has a cutoff
        after the month's start."""
        for queue, type, _jobs in month.contents:
            cutoff = self.cutoff(queue, type)
            if cutoff is not None and cutoff > month.month:
                return True
        return False


def _month_end(month: datetime) -> datetime:
    """Return the first instant of the month after ``month`` (UTC)."""
    start = month.astimezone(UTC)
    if start.month == 12:
        return start.replace(year=start.year + 1, month=1)
    return start.replace(month=start.month + 1)


async def _drop_month(conn: AsyncConn, month: archive.ArchiveMonth, lock_timeout_s: float) -> None:
    """Drop one month of the archive in its own short transaction."""
    timeout_ms = max(1, int(lock_timeout_s * 1000))
    await _alone(conn, archive.drop_month(conn, month.month, lock_timeout_ms=timeout_ms))
    log.info(
        "retention.month_dropped",
        extra={"month": f"{month.month:%Y-%m}", "jobs": sum(c[2] for c in month.contents)},
    )


async def _forget_orphans(conn: AsyncConn, *, before: datetime) -> None:
    """Delete the dependency edges and on_fail records of the jobs of dropped months."""
    while True:
        gone = await _alone(conn, archive.forget_orphans(conn, before=before, limit=_ORPHANS_BATCH))
        if gone["edges"] < _ORPHANS_BATCH and gone["hooks"] < _ORPHANS_BATCH:
            return


async def _prune_archive_month(
    conn: AsyncConn,
    params: dict[str, Any],
    month: datetime,
    until: datetime,
    batch_size: int,
    dry_run: bool,
    counts: Counter[str],
) -> tuple[int, int]:
    """Delete the due jobs of one month of the archive that ended before ``until``, in
    batches; return the batches and the rows read."""
    batches = scanned = 0
    after_at, after_id = _OLDEST, _MIN_ID
    while True:
        batch = await store.archive_scan_batch(
            conn, params, from_at=month, until_at=until, after_at=after_at, after_id=after_id
        )
        batches += 1
        scanned += batch.scanned
        if batch.ids:
            if dry_run:
                counts.update(batch.queues)
            else:
                counts.update(await store.archive_delete_batch(conn, batch.ids, batch.finished))
        if batch.scanned < batch_size or batch.last_at is None or batch.last_id is None:
            return batches, scanned
        after_at, after_id = batch.last_at, batch.last_id


async def _alone(conn: AsyncConn, statement: Awaitable[T]) -> T:
    """Await one statement as a transaction of its own (autocommit, or begun here)."""
    if conn.autocommit:
        return await statement
    async with conn.transaction():
        return await statement
