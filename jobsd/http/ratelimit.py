"""Limit the rate of submissions per bearer token: a token bucket per key, in memory.

``JOBSD_SUBMIT_RATE=N/UNIT`` (``20/s``, ``600/m``, ``5000/h``) gives each key a
bucket of N submissions that refills at N per UNIT: a client may send N at once,
then N per UNIT on average. The buckets live in the API process: with several API
processes each one counts on its own, so the limit a token sees is N times the
number of processes. The clock is injectable (tests pin it).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Rate", "SubmitLimiter"]

_RATE = re.compile(
    r"^\s*(?P<count>\d{1,9})\s*/\s*(?P<unit>s|sec|second|m|min|minute|h|hour)\s*$",
    re.IGNORECASE,
)
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` submissions per ``unit_s`` seconds, ``count`` of them at once."""

    count: int
    unit_s: float
    text: str

    @classmethod
    def parse(cls, text: str) -> Rate:
        """Read ``N/s``, ``N/m`` or ``N/h`` (N at least 1); raise ValueError otherwise."""
        match = _RATE.match(text)
        if match is None or int(match.group("count")) < 1:
            raise ValueError(
                f"not a rate: {text!r} (use N/s, N/m or N/h with N >= 1, e.g. 20/s or 600/m)"
            )
        count = int(match.group("count"))
        unit = match.group("unit")[0].lower()
        return cls(count, _UNIT_S[unit], f"{count}/{unit}")

    @property
    def per_s(self) -> float:
        """Return the refill rate in submissions per second."""
        return self.count / self.unit_s


# keys kept before idle (full) buckets are dropped: a full bucket is the same as none
_PRUNE_AT = 10_000


class SubmitLimiter:
    """Token buckets keyed by token id (or org); ``take`` says whether one more may pass."""

    def __init__(self, rate: Rate, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.clock = clock
        # key -> (tokens left, clock reading of that count)
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key: str) -> float:
        """Take one submission from ``key``'s bucket: 0.0 if it may pass, else seconds to wait.

        A refused submission takes nothing: retrying after the wait succeeds.
        """
        now = self.clock()
        rate = self.rate
        tokens, then = self._buckets.get(key, (float(rate.count), now))
        tokens = min(float(rate.count), tokens + max(now - then, 0.0) * rate.per_s)
        if tokens >= 1.0:
            self._store(key, tokens - 1.0, now)
            return 0.0
        self._store(key, tokens, now)
        return (1.0 - tokens) / rate.per_s

    def retry_after_s(self, wait_s: float) -> int:
        """Return the whole seconds for ``Retry-After`` (at least 1)."""
        return max(1, math.ceil(wait_s))

    def _store(self, key: str, tokens: float, now: float) -> None:
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > _PRUNE_AT:
            full_after_s = self.rate.unit_s
            self._buckets = {
                k: v for k, v in self._buckets.items() if now - v[1] < full_after_s or k == key
            }
