"""Bounds that keep one client from taking the API's connections from the others.

- ``ConcurrencyCap``: how many long-polls (``GET /jobs/{id}?wait=``) may be open at
  once, in all and per token. A long-poll holds no database connection while it
  waits, but each one is a task, a socket and a read at every wake-up; beyond the
  cap the request answers 429 at once instead of queueing.
- ``ProbeCache``: the probes (``/readyz``, ``/health``, ``/metrics``) ask the database
  at most once per ``max_age_s`` whatever the number of callers: while a refresh is
  in flight the others get the previous answer at once (the very first ones wait for
  it), later ones its answer (or its failure) until it is ``max_age_s`` old. A
  flood of probes costs at most one query a second, on the probes' own connection.
  The API also keeps the answer of each token lookup this way for a second: a
  flood with one token costs one lookup a second, and a revoked
  token stops working within a second.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio

__all__ = ["ConcurrencyCap", "ProbeCache"]

# names kept before old answers are dropped
_PRUNE_AT = 10_000


class ConcurrencyCap:
    """Count open holders, in all and per key; refuse beyond ``total`` or ``per_key``."""

    def __init__(self, total: int, per_key: int) -> None:
        self.total = total
        self.per_key = per_key
        self.open = 0
        self._by_key: dict[str, int] = {}

    @contextmanager
    def hold(self, key: str) -> Iterator[bool]:
        """Take a place for ``key`` for the block; yield False (and take nothing) when full."""
        held = self._by_key.get(key, 0)
        if self.open >= self.total or held >= self.per_key:
            yield False
            return
        self.open += 1
        self._by_key[key] = held + 1
        try:
            yield True
        finally:
            self.open -= 1
            left = self._by_key[key] - 1
            if left:
                self._by_key[key] = left
            else:
                del self._by_key[key]


class ProbeCache:
    """Answer each named probe from one query at most every ``max_age_s`` seconds."""

    def __init__(self, max_age_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.max_age_s = max_age_s
        self.clock = clock
        self.queries = 0
        """how many times a probe's query actually ran (tests read it)"""
        self._locks: dict[str, anyio.Lock] = {}
        # name -> (clock reading, answer or None, exception or None)
        self._answers: dict[str, tuple[float, Any, BaseException | None]] = {}

    async def get(self, name: str, query: Callable[[], Awaitable[Any]]) -> Any:
        """Return ``query()``'s answer, or re-raise its exception, at most ``max_age_s`` old."""
        lock = self._locks.setdefault(name, anyio.Lock())
        cached = self._answers.get(name)
        if cached is not None and lock.locked():
            # a refresh is in flight: the last answer now beats a current one later
            if cached[2] is not None:
                raise cached[2]
            return cached[1]
        async with lock:
            cached = self._answers.get(name)
            if cached is None or self.clock() - cached[0] >= self.max_age_s:
                self.queries += 1
                try:
                    answer: Any = await query()
                    cached = (self.clock(), answer, None)
                except Exception as exc:
                    cached = (self.clock(), None, exc)
                self._answers[name] = cached
                if len(self._answers) > _PRUNE_AT:
                    self._prune()
        if cached[2] is not None:
            raise cached[2]
        return cached[1]

    def _prune(self) -> None:
        """Forget answers too old to be used again (many names: e.g. token hashes)."""
        now = self.clock()
        stale = [k for k, v in self._answers.items() if now - v[0] >= self.max_age_s]
        for name in stale:
            del self._answers[name]
            lock = self._locks.get(name)
            if lock is not None and not lock.locked():
                del self._locks[name]
