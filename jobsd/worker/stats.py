"""Counters the daemon keeps about itself (exported as metrics by the HTTP layer)."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from jobsd.worker.outcome import Outcome, error_cause_of

__all__ = [
    "ERROR_CAUSES",
    "MAX_TYPE_LABELS",
    "OTHER_CAUSE",
    "OTHER_TYPE",
    "RUN_BUCKETS_S",
    "DaemonStats",
    "RunTimes",
    "error_cause",
]

# Job types are chosen by tenants: only registered ones become metric labels, and at
# most MAX_TYPE_LABELS of them; every other type is counted under OTHER_TYPE.
OTHER_TYPE = "_other"
MAX_TYPE_LABELS = 200

# upper bounds of the run-time histogram, in seconds
RUN_BUCKETS_S = (0.005, 0.025, 0.1, 0.25, 1.0, 2.5, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


# The causes an attempt's error is counted under (``jobsd_job_errors``): the reasons
# jobsd writes with a failed run. A reason outside them is counted as OTHER_CAUSE, so
# the label stays a short, fixed set.
ERROR_CAUSES = frozenset(
    {
        "handler error",
        "timeout",
        "stalled",
        "handler crashed",
        "memory limit",
        "unknown type",
        "progress too large",
        "report too large",
        "invalid report",
        "shutdown",
        "fenced",
        "worker lost",
        "cancel requested",
    }
)
OTHER_CAUSE = "other"


def error_cause(outcome: Outcome) -> str | None:
    """Return the cause a run that ended in ``outcome`` is counted under: the cause of
    the error record its write appends to the job (``jobs.errors``), within the fixed
    set of ERROR_CAUSES (else OTHER_CAUSE); None when it appends none (it succeeded,
    was cancelled on request, or was put back in its queue unharmed by a stop)."""
    cause = error_cause_of(outcome)
    if cause is None:
        return None
    return cause if cause in ERROR_CAUSES else OTHER_CAUSE


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
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    """runs that ended in an error, retried or not, by (type, cause): ``error_cause``"""
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

    def count_error(self, type: str, outcome: Outcome) -> None:
        """Count a written outcome in ``errors`` if its run ended in an error."""
        cause = error_cause(outcome)
        if cause is not None:
            self.errors[(self.label(type), cause)] += 1

    def label(self, type: str) -> str:
        """Return the metric label of ``type``: itself if registered and under the cap."""
        if type in self._labels:
            return type
        if (self.known is not None and not self.known(type)) or len(self._labels) >= self.max_types:
            return OTHER_TYPE
        self._labels.add(type)
        return type
