"""The sweeper's check of the database's clock against its own monotonic clock (T11b)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobsd.worker.clockwatch import DbClockWatch, Reading

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _at(db_s: float, before: float, after: float | None = None) -> Reading:
    return Reading(T0 + timedelta(seconds=db_s), before, before if after is None else after)


def test_a_forward_step_holds_stale_sweeps_off_for_hold_s(caplog: pytest.LogCaptureFixture) -> None:
    watch = DbClockWatch(hold_s=3.0, slack_s=0.3)
    assert watch.trust(_at(0, 100))
    assert watch.trust(_at(1, 101))
    with caplog.at_level(logging.WARNING):
        assert not watch.trust(_at(8, 102))  # 1 s passed here, 7 s there: a 6 s step
    assert watch.jumps == 1
    (record,) = [r for r in caplog.records if r.getMessage() == "sweeper.db_clock_jumped"]
    assert record.__dict__["jump_s"] == pytest.approx(6.0)
    assert not watch.trust(_at(9, 103))
    assert not watch.trust(_at(10.9, 104.9))
    assert watch.trust(_at(11, 105))  # hold_s after the step was seen
    assert watch.trust(_at(12, 106))


def test_a_slow_round_trip_is_not_a_step() -> None:
    watch = DbClockWatch(hold_s=3.0, slack_s=0.3)
    # the first reading's answer took 5 s: the database's time may be anywhere in it
    assert watch.trust(_at(0, 100, 105))
    assert watch.trust(_at(5.9, 106, 106.1))
    # the next one is read at the start of a 4 s round trip, the one after at its end
    assert watch.trust(_at(7.0, 107, 111))
    assert watch.trust(_at(11.0, 111.2, 111.3))
    assert watch.jumps == 0


def test_a_backward_step_is_logged_and_does_not_hold(caplog: pytest.LogCaptureFixture) -> None:
    watch = DbClockWatch(hold_s=3.0, slack_s=0.3)
    assert watch.trust(_at(100, 100))
    with caplog.at_level(logging.WARNING):
        assert watch.trust(_at(50, 101))
    assert [r.getMessage() for r in caplog.records] == ["sweeper.db_clock_went_back"]
    assert watch.jumps == 0


def test_the_first_reading_is_trusted() -> None:
    assert DbClockWatch(hold_s=600, slack_s=60).trust(_at(0, 0))


@given(
    gaps=st.lists(st.floats(0.0, 120.0), min_size=1, max_size=30),
    rtts=st.lists(st.floats(0.0, 10.0), min_size=31, max_size=31),
)
def test_a_clock_that_does_not_step_is_always_trusted(gaps: list[float], rtts: list[float]) -> None:
    """Whatever the pauses and round trips, a database time read within the round trip
    is never taken for a step."""
    watch = DbClockWatch(hold_s=3.0, slack_s=0.001)  # timestamps are to the microsecond
    mono = 0.0
    for i, gap in enumerate([0.0, *gaps]):
        mono += gap
        before, after = mono, mono + rtts[i]
        # the database read its clock somewhere in the round trip
        assert watch.trust(Reading(T0 + timedelta(seconds=before + rtts[i] / 2), before, after))
        mono = after
    assert watch.jumps == 0
