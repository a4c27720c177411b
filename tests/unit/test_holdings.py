"""Holdings: when claiming ahead goes on, and when jobs claimed ahead are stale (their
daemon's slots stay held by runs that last, so another daemon should have them)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from jobsd.models import Job, JobStatus
from jobsd.worker.clock import ManualClock
from jobsd.worker.executor import make_context
from jobsd.worker.holdings import Held, Holdings, RunPhase, RunStop

pytestmark = pytest.mark.anyio

WAIT_S = 1.0


def _job() -> Job:
    now = datetime.now(UTC)
    return Job(
        id=uuid.uuid4(),
        org_id="o",
        type="t",
        queue="default",
        status=JobStatus.RUNNING,
        attempts=1,
        dedup_key=None,
        payload={},
        progress=None,
        report=None,
        error=None,
        reason=None,
        run_after=now,
        lease_id=uuid.uuid4(),
        worker_id="w",
        created_at=now,
        started_at=now,
        finished_at=None,
    )


def _holdings(slots: int = 2, ahead: int = 2) -> tuple[Holdings, ManualClock]:
    clock = ManualClock()
    return Holdings(slots, clock, ahead=ahead, ahead_max_wait_s=WAIT_S), clock


def _run(holdings: Holdings) -> Held:
    job = _job()
    return holdings.add(job, make_context(job))


def _wait(holdings: Holdings) -> Held:
    job = _job()
    return holdings.add_waiting(job, make_context(job))


async def test_claiming_ahead_goes_on_while_slots_turn_over() -> None:
    holdings, clock = _holdings()
    assert holdings.claimable == 4  # two free slots and two ahead
    runs = [_run(holdings), _run(holdings)]
    assert holdings.claimable == 2
    clock.advance(0.01)
    holdings.release_slot(runs[0])  # a short run
    _run(holdings)
    clock.advance(WAIT_S / 2 - 0.01)  # the last slot freed half a wait ago, no later
    assert holdings.ahead_now == 2 and holdings.claimable == 2


async def test_claiming_ahead_stops_while_every_slot_is_held_past_half_the_wait() -> None:
    holdings, clock = _holdings()
    _run(holdings), _run(holdings)
    clock.advance(WAIT_S / 2 + 0.01)
    assert holdings.ahead_now == 0 and holdings.claimable == 0
    holdings.release_slot(next(iter(holdings)))  # a slot frees: that is turnover again
    assert holdings.free == 1
    assert holdings.claimable == 1  # the free slot; runs now average more than half a wait


async def test_claiming_ahead_stops_while_runs_average_more_than_half_the_wait() -> None:
    holdings, clock = _holdings(slots=4)
    for _ in range(3):
        run = _run(holdings)
        clock.advance(0.8)  # runs of 0.8 s: a job claimed ahead would wait about that
        holdings.release_slot(run)
    assert holdings.free == 4
    assert holdings.ahead_now == 0 and holdings.claimable == 4
    for _ in range(20):  # short runs bring the mean down again
        run = _run(holdings)
        clock.advance(0.001)
        holdings.release_slot(run)
    assert holdings.ahead_now == 2


async def test_before_any_run_ends_at_most_one_round_of_the_slots_is_claimed_ahead() -> None:
    holdings, _clock = _holdings(slots=3, ahead=60)
    assert holdings.ahead_now == 3 and holdings.claimable == 6
    few, _ = _holdings(slots=3, ahead=2)
    assert few.ahead_now == 2


async def test_jobs_claimed_ahead_are_as_many_as_the_slots_start_in_a_tenth_of_the_wait() -> None:
    holdings, clock = _holdings(slots=4, ahead=100)
    run = _run(holdings)
    clock.advance(0.05)  # runs of 50 ms: 4 slots start 8 jobs in 100 ms
    holdings.release_slot(run)
    assert holdings.ahead_now == 8 and holdings.claimable == 12
    run = _run(holdings)
    clock.advance(0.0001)  # shorter runs: the cap, not the time, bounds it
    for _ in range(40):
        holdings.release_slot(run)
        run = _run(holdings)
        clock.advance(0.0001)
    assert holdings.ahead_now == 100
    slow, clock = _holdings(slots=1, ahead=100)
    run = _run(slow)
    clock.advance(0.2)  # one slot, runs of 200 ms: not even one job fits in 100 ms
    slow.release_slot(run)
    assert slow.ahead_now == 0 and slow.claimable == 1


async def test_jobs_claimed_ahead_are_stale_once_no_slot_freed_for_the_whole_wait() -> None:
    holdings, clock = _holdings(slots=1, ahead=1)
    assert holdings.stale_in() is None  # nothing waits
    _run(holdings)
    clock.advance(0.3)
    _wait(holdings)
    # the wait counts from the later of the last freed slot and the claim
    assert holdings.stale_in() == pytest.approx(WAIT_S)
    clock.advance(WAIT_S - 0.1)
    assert holdings.stale_in() == pytest.approx(0.1)
    clock.advance(0.1)
    assert holdings.stale_in() == 0.0
    taken = holdings.take_waiting()
    assert len(taken) == 1 and holdings.stale_in() is None and holdings.waiting == 0


async def test_a_freed_slot_starts_the_waiting_job_instead_of_making_it_stale() -> None:
    holdings, clock = _holdings(slots=1, ahead=1)
    run = _run(holdings)
    _wait(holdings)
    clock.advance(WAIT_S - 0.1)
    holdings.release_slot(run)
    assert len(holdings.take_startable()) == 1 and holdings.stale_in() is None


async def test_a_reserved_job_takes_a_slot_only_to_start_and_runs_under_its_new_lease() -> None:
    holdings, _clock = _holdings(slots=2, ahead=4)
    run = _run(holdings)
    waiting = [_wait(holdings) for _ in range(3)]
    assert all(h.reserved for h in waiting) and holdings.running == 1
    (taken,) = holdings.take_startable()  # one free slot: the oldest
    assert taken is waiting[0] and holdings.free == 0 and holdings.waiting == 2
    reservation, lease = taken.lease_id, taken.start_lease_id
    assert lease is not None and lease in holdings.leases()
    holdings.started(taken, 3, datetime.now(UTC))
    assert (taken.reserved, taken.lease_id, taken.ctx.attempt) == (False, lease, 3)
    assert (taken.job.status, taken.job.attempts) == (JobStatus.RUNNING, 3)
    assert holdings.get(lease) is taken and holdings.get(reservation) is None
    holdings.release_slot(run)
    (refused,) = holdings.take_startable()
    holdings.not_started(refused)  # its reservation was gone: the slot frees, no run ended
    assert holdings.free == 1 and holdings.get(refused.lease_id) is None
    assert holdings.running == 1


async def test_a_reserved_job_whose_reservation_was_lost_is_let_go_not_started() -> None:
    holdings, _clock = _holdings(slots=1, ahead=2)
    waiting = _wait(holdings)
    holdings.mark_lost(waiting)
    assert holdings.take_startable() == [] and holdings.waiting == 0 and len(holdings) == 0


async def test_booked_slots_are_taken_until_returned() -> None:
    holdings, _clock = _holdings(slots=3, ahead=0)
    booked = holdings.book(holdings.free)
    assert booked == 3 and holdings.free == 0
    job = _job()
    holdings.add(job, make_context(job), booked=True)
    holdings.unbook(booked - 1)
    assert holdings.free == 2 and holdings.running == 1


async def test_a_stop_takes_every_reserved_job() -> None:
    holdings, _clock = _holdings(slots=1, ahead=5)
    _run(holdings)
    waiting = [_wait(holdings), _wait(holdings)]
    assert holdings.take_waiting() == waiting
    assert holdings.waiting == 0 and holdings.take_startable() == []
    assert len(holdings) == 1


def test_a_started_job_is_the_reserved_one_with_its_start_applied() -> None:
    # Job.started builds the job positionally: every other field must come through
    reserved = replace(
        _job(),
        status=JobStatus.QUEUED,
        attempts=2,
        reason="due",
        dedup_key="d",
        progress={"done": 1},
        report={"r": 1},
        error="e",
        cancel_requested_at=datetime.now(UTC),
        priority=-3,
        concurrency_key="k",
        trace_context={"traceparent": "x"},
        reserved_until=datetime.now(UTC),
    )
    lease, at = uuid.uuid4(), datetime.now(UTC)
    assert reserved.started(3, lease, at) == replace(
        reserved,
        status=JobStatus.RUNNING,
        attempts=3,
        lease_id=lease,
        started_at=at,
        reason=None,
        reserved_until=None,
    )


async def test_a_run_moves_through_its_phases_and_keeps_the_strongest_stop() -> None:
    holdings = Holdings(2, ManualClock(), ahead=2)
    queued = replace(_job(), status=JobStatus.QUEUED)
    held = holdings.add_waiting(queued, make_context(queued))
    assert held.phase is RunPhase.RESERVED and held.reserved
    (taken,) = holdings.take_startable()
    assert taken is held and held.phase is RunPhase.STARTING and held.reserved
    holdings.started(held, 1, datetime.now(UTC))
    assert held.phase is RunPhase.RUNNING and not held.reserved

    # a cancel request, then the stop: the stop writes the job back
    assert holdings.request_cancel(held) and held.stop is RunStop.CANCEL_REQUESTED
    holdings.interrupt(held, RunStop.SHUTDOWN)
    assert held.stop is RunStop.SHUTDOWN and held.interrupted and not held.fenced
    # the fence after the stop: the fence's cause
    holdings.interrupt(held, RunStop.FENCED)
    assert held.fenced
    # a lost lease trumps all (its outcome is moot); nothing weaker comes back
    assert holdings.mark_lost(held) and held.lost
    assert not holdings.request_cancel(held)
    holdings.interrupt(held, RunStop.SHUTDOWN)
    assert held.stop is RunStop.LEASE_LOST
    assert not holdings.mark_lost(held), "already known"
    holdings.release_slot(held)
    assert held.phase is RunPhase.ENDED and held.finished
    assert not holdings.request_cancel(held)


async def test_an_earlier_run_of_a_job_claimed_again_is_superseded_for_good() -> None:
    holdings = Holdings(2, ManualClock())
    first = _job()
    old = holdings.add(first, make_context(first))
    again = replace(first, lease_id=uuid.uuid4(), attempts=2)
    holdings.add(again, make_context(again))
    assert old.superseded and old.lost and old.stop is RunStop.SUPERSEDED
    # a later lost lease does not make it any less superseded
    assert not holdings.mark_lost(old)
    assert old.stop is RunStop.SUPERSEDED
