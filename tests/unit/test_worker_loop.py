"""The services' shared parts: jitter, the outage policy, the loop, the mailbox, the clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobsd.errors import BackendUnavailable, DatabaseError
from jobsd.worker.clock import ManualClock
from jobsd.worker.loop import jitter, pause, run_loop, through_outage
from jobsd.worker.mailbox import Mailbox


@given(interval_s=st.floats(0.001, 86_400))
def test_jitter_stays_within_a_third_of_the_interval(interval_s: float) -> None:
    assert interval_s * 2 / 3 <= jitter(interval_s) <= interval_s * 4 / 3


@pytest.mark.anyio
async def test_an_outage_is_retried_with_back_off_on_the_clock() -> None:
    clock = ManualClock()
    calls = 0

    async def step() -> str:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise BackendUnavailable("database away")
        return "done"

    assert await through_outage("test", step, clock) == "done"
    assert calls == 4
    # three back-offs, growing from 50 ms (plus up to 200 ms of jitter each)
    assert len(clock.slept) == 3
    for wait, base in zip(clock.slept, (0.05, 0.1, 0.2), strict=True):
        assert base <= wait <= base + 0.2


@pytest.mark.anyio
async def test_other_errors_are_not_retried() -> None:
    clock = ManualClock()

    async def step() -> None:
        raise DatabaseError("constraint violated")

    with pytest.raises(DatabaseError):
        await through_outage("test", step, clock)
    assert clock.slept == []


@pytest.mark.anyio
async def test_the_loop_reports_started_after_its_first_pass_when_asked() -> None:
    clock = ManualClock()
    passes: list[int] = []

    async def step() -> None:
        passes.append(len(passes))
        if len(passes) == 1:
            raise BackendUnavailable("not yet")

    async with anyio.create_task_group() as tg:
        await tg.start(
            lambda task_status: run_loop(
                "test",
                step,
                pause(10.0, clock),
                clock,
                task_status=task_status,
                started_after_first_pass=True,
            )
        )
        # started only once a pass succeeded: the failed one and its retry ran
        assert passes == [0, 1]
        tg.cancel_scope.cancel()
    # the pause between passes is a jittered 10 s on the clock
    assert all(6.6 < s < 13.4 for s in clock.slept[1:])


@pytest.mark.anyio
async def test_the_mailbox_wakes_its_taker_and_keeps_items_until_dropped() -> None:
    box: Mailbox[int] = Mailbox()
    got: list[int] = []

    async def taker() -> None:
        await box.wait()
        got.extend(box.peek(10))

    async with anyio.create_task_group() as tg:
        tg.start_soon(taker)
        await anyio.lowlevel.checkpoint()
        assert got == []
        box.put(1)
        box.put(2)
    assert got == [1, 2] and len(box) == 2
    box.drop(1)
    assert box.take() == 2 and len(box) == 0
    box.put(3)
    with anyio.fail_after(1):
        await box.wait()  # an item waits: at once


def test_the_manual_clock_moves_only_when_told() -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    clock = ManualClock(start, monotonic=5.0)
    assert (clock.now(), clock.monotonic(), clock.sql_now()) == (start, 5.0, start)
    clock.advance(90)
    assert clock.now() == start + timedelta(seconds=90) and clock.monotonic() == 95.0
    with pytest.raises(ValueError):
        clock.advance(-1)
