"""Counters the daemon keeps about itself (exported as metrics by the HTTP layer)."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["MAX_TYPE_LABELS", "OTHER_TYPE", "RUN_BUCKETS_S", "DaemonStats", "RunTimes"]

# Job types are chosen by tenants: only registered ones become metric labels, and at
# most MAX_TYPE_LABELS of them; every other type is counted under OTHER_TYPE.
OTHER_TYPE = "_other"
MAX_TYPE_LABELS = 200

# upper bounds of the run-time histogram, in seconds
RUN_BUCKETS_S = (0.005, 0.025, 0.1, 0.25, 1.0, 2.5, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


@dataclass(slots=True)
class RunTimes:
    """Handler run times by type, as histogram buckets (the HTTP layer exports them).

    ``counts[type][i]`` counts runs of at most ``bounds_s[i]`` (and above the previous
    bound); the last count is for runs above every bound.
    """

    bounds_s: tuple[float, ...] = RUN_BUCKETS_S
    counts: dict[str, list[int]] = field(default_factory=dict)
    sums_s: dict[str, float] = field(default_factory=dict)

    def observe(self, type: str, seconds: float) -> None:
        """Record one run of ``type`` that took ``seconds``."""
        counts = self.counts.setdefault(type, [0] * (len(self.bounds_s) + 1))
        counts[bisect.bisect_left(self.bounds_s, seconds)] += 1
        self.sums_s[type] = self.sums_s.get(type, 0.0) + seconds


@dataclass(slots=True)
class DaemonStats:
    """Plain counters; only the event loop thread writes them."""

    claimed: Counter[str] = field(default_factory=Counter)
    """jobs claimed, by type"""
    finished: Counter[tuple[str, str]] = field(default_factory=Counter)
    """outcomes written, by (type, status)"""
    discarded: int = 0
    """outcomes not written because the lease was lost"""
    given_back: int = 0
    """jobs claimed ahead given back unstarted: every slot stayed held by a run that lasted"""
    wakeups: Counter[str] = field(default_factory=Counter)
    """claimer wake-ups, by cause: notify, poll, reconnect, more, due"""
    reconnects: int = 0
    """LISTEN connections re-established"""
    swept: Counter[str] = field(default_factory=Counter)
    """jobs rescued by this daemon's sweeper, by new status"""
    deaths: int = 0
    """other daemons this one declared dead (lock free, lease over) and rescued"""
    sweeps_refused: int = 0
    """sweeper passes the database refused (poison: logged, tried at the next interval)"""
    archived: int = 0
    """ended jobs this daemon moved into the archive"""
    archive_refused: int = 0
    """archive passes the database refused (logged, tried at the next interval)"""
    last_notify_monotonic: float | None = None
    run_s: RunTimes = field(default_factory=RunTimes)
    """handler run times, by type"""
    known: Callable[[str], object] | None = None
    """Says whether a type is registered (truthy); None: every type is."""
    max_types: int = MAX_TYPE_LABELS
    _labels: set[str] = field(default_factory=set)

    def label(self, type: str) -> str:
        """Return the metric label of ``type``: itself if registered and under the cap."""
        if type in self._labels:
            return type
        if (self.known is not None and not self.known(type)) or len(self._labels) >= self.max_types:
            return OTHER_TYPE
        self._labels.add(type)
        return type
