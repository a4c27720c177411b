"""A clock that tests move by hand, for code that takes an injected monotonic clock."""

from __future__ import annotations


class FakeClock:
    """A monotonic clock that moves only when told: ``clock.now += 30``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
