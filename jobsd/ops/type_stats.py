"""What each job type did over the last hour and the last day, within the caller's scope.

The figures come from ``jobsd.type_stats`` (migration 0029), the rollup the archive's
move keeps per minute and hour, and the ended jobs not archived yet: a page costs a few
thousand rollup rows, whatever the number of jobs. Run durations are kept as counts
in log-spaced buckets, two per doubling; a percentile is interpolated within its
bucket, so it is within that bucket's width (41 %) of the exact one.

An org's caller sees its own org's figures; an operator sees every org's, or one org's
when it names one (as the jobs list).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from jobsd.ops.caller import Caller
from jobsd.store import ui as store
from jobsd.store.db import AsyncConn

__all__ = [
    "DAY_MINUTES",
    "HOUR_MINUTES",
    "TOP_BUCKET",
    "TypeStats",
    "Window",
    "bucket_bounds",
    "percentile",
    "read_type_stats",
]

HOUR_MINUTES = 60
DAY_MINUTES = 1440
# the last bucket: 2^31 ms (24.9 days) and more; -1 counts the jobs that never ran
TOP_BUCKET = 63


def bucket_bounds(bucket: int) -> tuple[float, float]:
    """Return the run durations (seconds) a bucket holds, [low, high): bucket 0 is
    under 1 ms, bucket k in 1..62 is [2^((k-1)/2), 2^(k/2)) ms, the top one has no end."""
    if bucket == 0:
        return 0.0, 0.001
    if not 0 < bucket <= TOP_BUCKET:
        raise ValueError(f"no run-duration bucket {bucket}")
    low = 2 ** ((bucket - 1) / 2) / 1000
    return low, (math.inf if bucket == TOP_BUCKET else 2 ** (bucket / 2) / 1000)


def percentile(histogram: Mapping[int, int], q: float) -> float | None:
    """Return the ``q`` quantile (0 < q <= 1) of the run durations counted in
    ``histogram`` (bucket -> runs), in seconds; None when it counts no run.

    The rank is ``q`` times the runs; within its bucket the value is interpolated
    geometrically (linearly in bucket 0; the top bucket gives its low bound).
    """
    if not 0 < q <= 1:
        raise ValueError(f"a quantile is in (0, 1], not {q}")
    runs = {b: n for b, n in histogram.items() if b >= 0 and n > 0}
    total = sum(runs.values())
    if total == 0:
        return None
    rank = q * total
    below = 0
    for bucket in sorted(runs):
        count = runs[bucket]
        if below + count >= rank:
            share = (rank - below) / count
            low, high = bucket_bounds(bucket)
            if bucket == 0:
                return low + share * (high - low)
            if math.isinf(high):
                return low
            return float(low * (high / low) ** share)
        below += count
    raise AssertionError("unreachable: the rank is within the total")


@dataclass(slots=True)
class Window:
    """What ended of one type over a window of ``minutes``."""

    minutes: int
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    run_s: float = 0.0
    """the sum of the run durations, seconds"""
    histogram: dict[int, int] = field(default_factory=dict)
    """run-duration bucket -> jobs (-1: never ran)"""

    @property
    def finished(self) -> int:
        """Return the jobs that ended: succeeded, failed or cancelled."""
        return self.succeeded + self.failed + self.cancelled

    @property
    def runs(self) -> int:
        """Return the ended jobs that ran (a job cancelled before it started did not)."""
        return sum(n for b, n in self.histogram.items() if b >= 0)

    @property
    def failure_rate(self) -> float | None:
        """Return failed / finished; None when nothing ended."""
        return self.failed / self.finished if self.finished else None

    @property
    def per_minute(self) -> float:
        """Return the jobs that ended per minute, on average over the window."""
        return self.finished / self.minutes

    @property
    def per_hour(self) -> float:
        """Return the jobs that ended per hour, on average over the window."""
        return self.finished * 60 / self.minutes

    @property
    def mean_s(self) -> float | None:
        """Return the mean run duration, seconds; None when nothing ran."""
        return self.run_s / self.runs if self.runs else None

    @property
    def p50_s(self) -> float | None:
        """Return the median run duration, seconds (within a bucket's width)."""
        return percentile(self.histogram, 0.5)

    @property
    def p95_s(self) -> float | None:
        """Return the 95th percentile of run durations, seconds (within a bucket's width)."""
        return percentile(self.histogram, 0.95)


@dataclass(slots=True)
class TypeStats:
    """One job type: the last hour, the last day, and the last hour minute by minute
    (minutes ago -> (succeeded, failed); 0 is the current minute)."""

    type: str
    hour: Window = field(default_factory=lambda: Window(HOUR_MINUTES))
    day: Window = field(default_factory=lambda: Window(DAY_MINUTES))
    minutes: dict[int, tuple[int, int]] = field(default_factory=dict)


async def read_type_stats(
    conn: AsyncConn,
    caller: Caller,
    *,
    type: str | None = None,
    org_id: str | None = None,
    now: datetime | None = None,
) -> list[TypeStats]:
    """Return the figures of every type that ended a job over the last day (or of
    ``type`` only), by type name, as ``caller`` may see them; ``org_id`` narrows an
    operator's to one org. ``now`` None is the database's clock."""
    allowed, org = caller.org_to_read(org_id)
    if not allowed:
        return []
    found: dict[str, TypeStats] = {}
    for row in await store.type_figures(conn, org, type, now=now):
        stats = found.setdefault(row["type"], TypeStats(row["type"]))
        window = stats.hour if row["span"] == "hour" else stats.day
        ok, bad, gone = int(row["succeeded"]), int(row["failed"]), int(row["cancelled"])
        window.succeeded += ok
        window.failed += bad
        window.cancelled += gone
        window.run_s += float(row["run_s"])
        bucket = int(row["run_bucket"])
        window.histogram[bucket] = window.histogram.get(bucket, 0) + ok + bad + gone
        if row["span"] == "hour":  # the chart: one statement, so it adds up to the figures
            minute = int(row["minutes_ago"])
            was = stats.minutes.get(minute, (0, 0))
            stats.minutes[minute] = (was[0] + ok, was[1] + bad)
    return [found[name] for name in sorted(found)]
