"""Notice the database's clock stepping, by this daemon's monotonic clock.

Heartbeats are stamped with the database's ``now()`` and the stale sweep compares them
with it: a forward step of that clock ages every heartbeat at once, and until each
owner's next beat every live job would look hung (fault campaign finding T11b). The
sweeper reads the database's time before each stale sweep and keeps the previous
reading with the monotonic times around it. Between two readings the database's clock
may advance at most as much as the monotonic clock did from just before the first
to just after the second (so a slow round trip is never taken for a step); beyond
that, plus ``slack_s``, it stepped forward. Then the stale sweep holds off for
``hold_s`` (``JOBSD_STALE_AFTER``): by then every live owner has beaten again (an
owner beats at least every third of it), and only owners that are truly silent still
look stale. Deaths proven by a lock are not affected.

A backward step makes heartbeats look younger: it can only delay a rescue, and is
logged. A step before the first reading (a sweeper started right after it) is not
seen. See docs/decisions.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

__all__ = ["DbClockWatch", "Reading"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Reading:
    """The database's time, and the monotonic times just before and after it was read."""

    db_now: datetime
    before: float
    after: float


class DbClockWatch:
    """Say whether the database's clock can be trusted for a stale sweep right now."""

    def __init__(self, *, hold_s: float, slack_s: float) -> None:
        self.hold_s = hold_s
        self.slack_s = slack_s
        self._last: Reading | None = None
        self._hold_until = float("-inf")
        self.jumps = 0
        """forward steps seen"""

    def trust(self, reading: Reading) -> bool:
        """Record ``reading``; return False while holding off after a forward step."""
        last, self._last = self._last, reading
        if last is not None:
            db_elapsed = (reading.db_now - last.db_now).total_seconds()
            step = db_elapsed - (reading.after - last.before)
            back = (reading.before - last.after) - db_elapsed
            if step > self.slack_s:
                self.jumps += 1
                self._hold_until = reading.after + self.hold_s
                log.warning(
                    "sweeper.db_clock_jumped",
                    extra={"jump_s": round(step, 3), "hold_s": self.hold_s},
                )
            elif back > self.slack_s:
                log.warning("sweeper.db_clock_went_back", extra={"jump_s": round(-back, 3)})
        return reading.after >= self._hold_until
