"""Watch jobsd from outside: its statements (Probe) and its backends' waits (WaitSampler).

The worker modules call ``queries.<name>(...)`` through the module, so swapping the
module attributes for timing wrappers sees every claim, finish, heartbeat, promotion
and sweep. The time is the statement's round trip on a pooled connection (waiting for
the connection is not included). Restored on exit.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import psycopg

from jobsd.store import queries

__all__ = ["Probe", "WaitSampler"]


@dataclass(slots=True)
class StatementStats:
    """Calls of one query function: how many, rows handled, seconds spent."""

    calls: int = 0
    rows: int = 0
    seconds: float = 0.0


def _rows_claimed(args: tuple[Any, ...], result: Any) -> int:
    return len(result)


def _rows_sent(args: tuple[Any, ...], result: Any) -> int:
    return len(args[1])


def _rows_promoted(args: tuple[Any, ...], result: Any) -> int:
    return int(result.promoted)


_WATCHED: dict[str, Callable[[tuple[Any, ...], Any], int]] = {
    "claim_batch": _rows_claimed,
    "finish_batch": _rows_sent,
    "heartbeat_v2": _rows_sent,
    "promote_due": _rows_promoted,
    "sweep_stale": _rows_claimed,
}


class Probe:
    """Statement counters, filled while ``installed()`` is active."""

    def __init__(self, on_call: Callable[[], None] | None = None) -> None:
        self.stats: dict[str, StatementStats] = {}
        self.on_call = on_call
        """called after every watched statement, before its caller resumes"""

    @contextmanager
    def installed(self) -> Iterator[Probe]:
        originals = {name: getattr(queries, name) for name in _WATCHED}
        try:
            for name, fn in originals.items():
                setattr(queries, name, self._wrap(name, fn, _WATCHED[name]))
            yield self
        finally:
            for name, fn in originals.items():
                setattr(queries, name, fn)

    def _wrap(
        self, name: str, fn: Callable[..., Any], rows_of: Callable[[tuple[Any, ...], Any], int]
    ) -> Callable[..., Any]:
        stats = self.stats.setdefault(name, StatementStats())

        async def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                result = await fn(*args, **kwargs)
            finally:
                stats.calls += 1
                stats.seconds += time.perf_counter() - t
            stats.rows += rows_of(args, result)
            if self.on_call is not None:
                self.on_call()
            return result

        return timed


_WAITS = """
SELECT CASE WHEN state <> 'active' THEN 'idle: waiting for the client'
            ELSE coalesce(wait_event_type || ':' || wait_event, 'on CPU') END
FROM pg_stat_activity
WHERE application_name = %s AND pid <> pg_backend_pid()
"""


class WaitSampler:
    """Sample what the backends of one application_name do, every ``interval_s``.

    Each backend counts once per sample: on CPU, waiting on an event (``Lock:object`` is
    the lock every committing transaction that sent a NOTIFY takes), or idle because its
    client has not sent the next statement yet.
    """

    def __init__(self, url: str, application: str, interval_s: float = 0.01) -> None:
        self.url = url
        self.application = application
        self.interval_s = interval_s
        self.seen: Counter[str] = Counter()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[WaitSampler]:
        stop = anyio.Event()
        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        async with conn, anyio.create_task_group() as tg:
            tg.start_soon(self._sample, conn, stop)
            try:
                yield self
            finally:
                stop.set()  # the loop ends after its current query; never cancel mid-query

    async def _sample(self, conn: psycopg.AsyncConnection[Any], stop: anyio.Event) -> None:
        while not stop.is_set():
            cur = await conn.execute(_WAITS, (self.application,))
            for (state,) in await cur.fetchall():
                self.seen[state] += 1
            with anyio.move_on_after(self.interval_s):
                await stop.wait()

    def summary(self, top: int = 3) -> str:
        """Say what the backends did most, as shares of all samples."""
        total = sum(self.seen.values())
        if not total:
            return ""
        parts = [f"{state} {count / total:.0%}" for state, count in self.seen.most_common(top)]
        return "backends: " + ", ".join(parts)
