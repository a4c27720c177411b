"""What each dashboard page shows: the reads of ``jobsd.ops`` shaped as plain data for
the templates (and ``jobsd top``).

Nothing here renders HTML or decides who sees what (the ops did, for the caller). The
throughput chart is computed as bar geometry (an inline SVG in the template needs no
script and no style attribute).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from jobsd.models import (
    OPEN_STATES,
    Job,
    JobEvent,
    JobStatus,
    last_progress_at,
    split_traceback,
)
from jobsd.models import JobView as JobRead
from jobsd.ops import AsyncConn, Caller
from jobsd.ops.listing import Cursor, JobPage, ListOptions, list_jobs
from jobsd.ops.overview import Overview

__all__ = [
    "Bar",
    "JobFilter",
    "JobView",
    "QueueRow",
    "job_page",
    "jobs_page",
    "minute_bars",
    "parse_time",
    "progress_of",
    "queue_rows",
    "span",
    "utc",
]


def utc(value: datetime) -> datetime:
    """Return ``value`` in UTC (naive: taken as UTC); ValueError when UTC cannot hold it."""
    try:
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+01:00: before the year 1 in UTC
        raise ValueError(f"{value.isoformat()} is out of range") from None


def parse_time(text: str | None) -> datetime | None:
    """Read a filter time (ISO 8601, e.g. from <input type=datetime-local>) as UTC."""
    return utc(datetime.fromisoformat(text)) if text else None


@dataclass(frozen=True, slots=True)
class Bar:
    """One minute of the throughput chart: x, and the heights of its two stacked parts."""

    x: int
    ok_y: int
    ok_h: int
    fail_y: int
    fail_h: int
    title: str


@dataclass(slots=True)
class QueueRow:
    """One queue of the overview."""

    name: str
    counts: dict[str, int]
    paused: bool
    capacity: int | None
    open_jobs: int
    concurrency_limit: int | None
    succeeded_1h: int = 0
    failed_1h: int = 0
    lag_s: float | None = None
    bars: list[Bar] = field(default_factory=list)

    @property
    def full(self) -> bool:
        """Say whether the queue holds its capacity of open jobs (enqueues are refused)."""
        return self.capacity is not None and self.open_jobs >= self.capacity


def span(seconds: float | None, *, compact: bool = False) -> str:
    """Say a duration for people: ``850 ms``, ``42 s``, ``12 min``, ``5 h``, ``3 d``
    (``compact``: ``42s``, ``12m``, for the terminal); ``-`` for None."""
    if seconds is None:
        return "-"
    gap = "" if compact else " "
    units = ("s", "min", "h", "d") if not compact else ("s", "m", "h", "d")
    if seconds < 1 and not compact:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.0f}{gap}{units[0]}"
    if seconds < 7200:
        return f"{seconds / 60:.0f}{gap}{units[1]}"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}{gap}{units[2]}"
    return f"{seconds / 86400:.0f}{gap}{units[3]}"


# the throughput chart's geometry (`jobsd top` and overview.html read it too): a bar
# a minute for the last CHART_MINUTES minutes, up to CHART_HEIGHT high
CHART_MINUTES = 60
CHART_HEIGHT = 32
BAR_WIDTH = 3


def minute_bars(per_minute: dict[int, tuple[int, int]]) -> list[Bar]:
    """Scale minute counts (minutes_ago -> (succeeded, failed)) to bars, oldest on the left."""
    peak = max((ok + bad for ok, bad in per_minute.values()), default=0)
    bars: list[Bar] = []
    if peak == 0:
        return bars
    for minutes_ago, (ok, bad) in sorted(per_minute.items()):
        if not 0 <= minutes_ago < CHART_MINUTES:
            continue
        x = (CHART_MINUTES - 1 - minutes_ago) * BAR_WIDTH
        ok_h = round(ok * CHART_HEIGHT / peak)
        fail_h = max(round(bad * CHART_HEIGHT / peak), 1 if bad else 0)
        bars.append(
            Bar(
                x=x,
                ok_y=CHART_HEIGHT - ok_h,
                ok_h=ok_h,
                fail_y=CHART_HEIGHT - ok_h - fail_h,
                fail_h=fail_h,
                title=f"{minutes_ago} min ago: {ok} succeeded, {bad} failed",
            )
        )
    return bars


def queue_rows(overview: Overview) -> list[QueueRow]:
    """Shape the overview's queues: open jobs by state, last hour, pickup lag, flags
    (the caller's own counts for an org, every org's for an operator)."""
    own, lags = overview.own_counts, overview.lags
    rows: dict[str, QueueRow] = {}
    for q in overview.queues:
        counts = q.depth if own is None else {s: own.get(q.name, {}).get(s, 0) for s in OPEN_STATES}
        rows[q.name] = QueueRow(
            name=q.name,
            counts=counts,
            paused=q.paused,
            capacity=q.capacity,
            open_jobs=q.open_jobs,
            concurrency_limit=q.concurrency_limit,
            lag_s=lags.get(q.name),
        )
    per_queue: dict[str, dict[int, tuple[int, int]]] = {}
    for m in overview.minutes:
        row = rows.get(m["queue"])
        if row is None:
            continue
        ok, bad = int(m["succeeded"]), int(m["failed"])
        row.succeeded_1h += ok
        row.failed_1h += bad
        per_queue.setdefault(row.name, {})[int(m["minutes_ago"])] = (ok, bad)
    for name, per_minute in per_queue.items():
        rows[name].bars = minute_bars(per_minute)
    return list(rows.values())


def progress_of(progress: dict[str, Any] | None) -> tuple[int, int] | None:
    """Return (done, total) of a progress report with a positive total, else None."""
    if not progress:
        return None
    done, total = progress.get("done"), progress.get("total")
    if not isinstance(done, int) or not isinstance(total, int) or total <= 0:
        return None
    return max(0, min(done, total)), total


@dataclass(frozen=True, slots=True)
class JobView:
    """A job page: the job, its history, its progress as (done, total), while it runs
    its handler's last sign of life (``models.last_progress_at``), and its report with
    a failure's traceback apart (shown as text, not in the report's JSON). The errors
    of its attempts are ``job.errors``, most recent first."""

    job: Job
    events: list[JobEvent]
    progress: tuple[int, int] | None
    last_progress_at: datetime | None = None
    report: dict[str, Any] | None = None
    """``job.report`` without ``error.traceback``"""
    report_traceback: str | None = None


def job_page(read: JobRead) -> JobView:
    """Shape a job read with its history (``ops.get``) for its page."""
    job = read.job
    last = last_progress_at(job.status, job.progress, job.started_at)
    report, traceback = split_traceback(job.report)
    return JobView(job, read.history, progress_of(job.progress), last, report, traceback)


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What a jobs list shows: each field None means any."""

    org_id: str | None = None
    status: JobStatus | None = None
    type: str | None = None
    queue: str | None = None
    since: datetime | None = None
    """created at or after"""
    until: datetime | None = None
    """created before"""

    def options(self) -> ListOptions:
        """Return the filters as ``ops.listing`` takes them (``until`` becomes a cursor)."""
        names = ("org_id", "status", "type", "queue", "since")
        return cast(ListOptions, {name: getattr(self, name) for name in names})


_FIRST_ID = uuid.UUID(int=0)


async def jobs_page(
    conn: AsyncConn, caller: Caller, filters: JobFilter, *, after: Cursor | None, limit: int
) -> JobPage:
    """List a page of jobs, newest first, as ``caller`` may see them (``ops.listing``).

    ``filters.org_id`` narrows an operator's list to one org (an org's caller sees its
    own jobs only). ``until`` is a keyset bound: jobs created before it,
    ``(created_at, id) < (until, 0)``.
    """
    if filters.until is not None and (after is None or filters.until <= after.created_at):
        after = Cursor(filters.until, _FIRST_ID)
    options = filters.options()
    options["after"], options["limit"] = after, limit
    return await list_jobs(conn, caller, **options)
