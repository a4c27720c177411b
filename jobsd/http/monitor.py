"""Measure event-loop lag, for /healthz: a stalled loop answers nothing on time."""

from __future__ import annotations

import time
from collections import deque

import anyio
from anyio.abc import TaskStatus

__all__ = ["LoopMonitor"]


class LoopMonitor:
    """Tick every ``interval_s`` and record how late each tick woke up."""

    def __init__(self, interval_s: float = 0.25, window_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self.window_s = window_s
        self.last_tick = time.monotonic()
        self._lags: deque[tuple[float, float]] = deque()

    def worst_lag_s(self) -> float:
        """Return the largest lag seen within the window."""
        horizon = time.monotonic() - self.window_s
        return max((lag for at, lag in self._lags if at >= horizon), default=0.0)

    def tick_age_s(self) -> float:
        """Return the time since the last tick (large when the loop is stalled now)."""
        return time.monotonic() - self.last_tick

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Tick forever."""
        task_status.started()
        while True:
            before = time.monotonic()
            await anyio.sleep(self.interval_s)
            now = time.monotonic()
            self.last_tick = now
            lag = max(now - before - self.interval_s, 0.0)
            self._lags.append((now, lag))
            while self._lags and self._lags[0][0] < now - self.window_s:
                self._lags.popleft()
