"""Counters the daemon keeps about itself (exported as metrics by the HTTP layer)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["DaemonStats"]


@dataclass(slots=True)
class DaemonStats:
    """Plain counters; only the event loop thread writes them."""

    claimed: Counter[str] = field(default_factory=Counter)
    """jobs claimed, by type"""
    finished: Counter[tuple[str, str]] = field(default_factory=Counter)
    """outcomes written, by (type, status)"""
    discarded: int = 0
    """outcomes not written because the lease was lost"""
    wakeups: Counter[str] = field(default_factory=Counter)
    """claimer wake-ups, by cause: notify, poll, reconnect, more, due"""
    reconnects: int = 0
    """LISTEN connections re-established"""
    swept: Counter[str] = field(default_factory=Counter)
    """jobs rescued by this daemon's sweeper, by new status"""
    last_notify_monotonic: float | None = None
