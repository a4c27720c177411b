"""The daemon's sense of time, injected into every service so tests can pin it.

``SystemClock`` is the real one. ``ManualClock`` is for tests: its time moves only when
told to (``advance``) or when a service sleeps on it (a sleep returns at once, having
moved the time on), so a test can step a service through hours without waiting.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

import anyio
import anyio.lowlevel

__all__ = ["SYSTEM_CLOCK", "Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """Wall time, monotonic time and sleeping, as one service sees them."""

    def now(self) -> datetime:
        """Return the wall time, timezone-aware (UTC)."""
        ...

    def monotonic(self) -> float:
        """Return seconds on a clock that never goes back, for intervals."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``; cancellable."""
        ...

    def sql_now(self) -> datetime | None:
        """Return the time a statement's ``now`` parameter gets: None means the
        database's own clock (every daemon and the database agree on it)."""
        ...


class SystemClock:
    """The real clock; statements use the database's ``now()``."""

    # a plain function, not a method: the hot path reads it per job
    monotonic = staticmethod(time.monotonic)

    def now(self) -> datetime:
        """Return the wall time (UTC)."""
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        await anyio.sleep(seconds)

    def sql_now(self) -> None:
        """Return None: statements use the database's clock."""
        return None


SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """A test clock: time stands still until ``advance`` or a ``sleep`` moves it.

    Statements get its wall time as their ``now``, so what a pass finds due or stale
    follows this clock, not the database's.
    """

    def __init__(self, now: datetime | None = None, *, monotonic: float = 1000.0) -> None:
        self._now = now if now is not None else datetime.now(UTC)
        self._monotonic = monotonic
        self.slept: list[float] = []
        """every sleep asked for, in seconds, oldest first"""

    def now(self) -> datetime:
        """Return the pinned wall time."""
        return self._now

    def monotonic(self) -> float:
        """Return the pinned monotonic time."""
        return self._monotonic

    def sql_now(self) -> datetime:
        """Return the pinned wall time: statements see this clock's time."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds``."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        self._now += timedelta(seconds=seconds)
        self._monotonic += seconds

    def jump(self, seconds: float) -> None:
        """Step the wall time alone by ``seconds`` (either way), as an NTP step or a
        clock set by hand does; the monotonic time stays."""
        self._now += timedelta(seconds=seconds)

    async def sleep(self, seconds: float) -> None:
        """Move the time on by ``seconds`` and return at once (after a checkpoint)."""
        self.slept.append(seconds)
        self.advance(max(seconds, 0.0))
        await anyio.lowlevel.checkpoint()
