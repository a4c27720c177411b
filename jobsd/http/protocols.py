"""What the HTTP layer reads from a daemon it is attached to.

``jobsd.http`` never imports ``jobsd.worker``: the supervisor hands itself over as a
``DaemonView`` and the API reads counters and flags through these protocols only.
Everything is read-only and read on the event loop thread that writes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

__all__ = ["DaemonView", "HoldingsView", "ListenerView", "RunTimesView", "StatsView"]


class ListenerView(Protocol):
    """The daemon's LISTEN connection."""

    @property
    def connected(self) -> bool:
        """Say whether the LISTEN connection is up."""
        ...


class HoldingsView(Protocol):
    """The daemon's slots."""

    @property
    def slots(self) -> int:
        """Return the number of slots."""
        ...

    @property
    def running(self) -> int:
        """Return the number of handlers running."""
        ...

    @property
    def waiting(self) -> int:
        """Return the number of jobs reserved ahead of the slots, not started."""
        ...


class StatsView(Protocol):
    """The daemon's counters (``jobsd.worker.stats.DaemonStats``)."""

    @property
    def claimed(self) -> Mapping[str, int]:
        """Return jobs claimed, by type."""
        ...

    @property
    def finished(self) -> Mapping[tuple[str, str], int]:
        """Return outcomes written, by (type, status)."""
        ...

    @property
    def errors(self) -> Mapping[tuple[str, str], int]:
        """Return runs that ended in an error, by (type, cause)."""
        ...

    @property
    def discarded(self) -> int:
        """Return outcomes dropped because the lease was lost."""
        ...

    @property
    def given_back(self) -> int:
        """Return jobs claimed ahead and given back unstarted (slots that did not free)."""
        ...

    @property
    def wakeups(self) -> Mapping[str, int]:
        """Return claimer wake-ups, by cause."""
        ...

    @property
    def reconnects(self) -> int:
        """Return LISTEN reconnections."""
        ...

    @property
    def swept(self) -> Mapping[str, int]:
        """Return jobs rescued by the sweeper, by new status."""
        ...

    @property
    def archived(self) -> int:
        """Return ended jobs moved into the archive."""
        ...

    @property
    def archive_refused(self) -> int:
        """Return moves into the archive the database refused."""
        ...

    @property
    def last_notify_monotonic(self) -> float | None:
        """Return the ``time.monotonic()`` of the last notification, or None."""
        ...


@runtime_checkable
class RunTimesView(Protocol):
    """Handler run times by type, as histogram buckets (optional: ``stats.run_s``).

    ``counts[type]`` has one count per bound in ``bounds_s`` (values at most that
    bound and above the previous one), then one for the values above the last.
    """

    @property
    def bounds_s(self) -> Sequence[float]:
        """Return the upper bounds of the buckets, in seconds, ascending."""
        ...

    @property
    def counts(self) -> Mapping[str, Sequence[int]]:
        """Return the per-bucket counts, by type."""
        ...

    @property
    def sums_s(self) -> Mapping[str, float]:
        """Return the total run time, by type."""
        ...


class DaemonSettingsView(Protocol):
    """The part of the daemon's settings the API needs."""

    @property
    def notify(self) -> bool:
        """Say whether the daemon LISTENs (else it is poll-only)."""
        ...


class DaemonView(Protocol):
    """A running daemon as the API sees it (``jobsd.worker.supervisor.Daemon``)."""

    @property
    def settings(self) -> DaemonSettingsView:
        """Return the daemon's settings."""
        ...

    @property
    def stats(self) -> StatsView:
        """Return the daemon's counters."""
        ...

    @property
    def listener(self) -> ListenerView:
        """Return the daemon's LISTEN connection."""
        ...

    @property
    def holdings(self) -> HoldingsView:
        """Return the daemon's slots."""
        ...

    def making_progress(self) -> bool:
        """Say whether the daemon's outcomes get written (none waiting too long)."""
        ...
