"""The one table of what a run's end becomes (``jobsd.worker.decide``), row by row."""

from __future__ import annotations

import pytest

from jobsd.models import JobStatus
from jobsd.worker.decide import End, Facts, Rules, Verdict, decide

ALO = Rules("at_least_once", max_attempts=3)
AMO = Rules("at_most_once", max_attempts=3)
RECOVER = Rules("at_most_once", max_attempts=3, recover=True)
# a recover hook on an at-least-once type changes nothing: its runs may repeat
ALO_WITH_HOOK = Rules("at_least_once", max_attempts=3, recover=True)

Q, S, F = JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.FAILED
OK, C, R = JobStatus.SUCCEEDED, JobStatus.CANCELLED, JobStatus.RECOVERY_REQUIRED

FIRST, LAST = Facts(attempts=1), Facts(attempts=3)
MATCHES = Facts(attempts=1, retry_matches=True)
MATCHES_LAST = Facts(attempts=3, retry_matches=True)
STUCK = Facts(attempts=1, thread_alive=True)
CANCEL = Facts(attempts=1, cancel_pending=True)

# (end, rules, facts) -> (status, reason)
TABLE = [
    # returned
    (End.RETURNED, ALO, FIRST, OK, ""),
    (End.RETURNED, AMO, FIRST, OK, ""),
    (End.RETURNED, RECOVER, FIRST, OK, ""),
    # raised: the retry policy, while attempts remain, whatever the delivery
    (End.RAISED, ALO, FIRST, F, "handler error"),
    (End.RAISED, ALO, MATCHES, S, "retry"),
    (End.RAISED, ALO, MATCHES_LAST, F, "handler error"),
    (End.RAISED, AMO, MATCHES, S, "retry"),
    (End.RAISED, RECOVER, FIRST, F, "handler error"),
    # timeout and stall of a stopped handler
    (End.TIMEOUT, ALO, FIRST, F, "timeout"),
    (End.TIMEOUT, ALO, MATCHES, S, "retry"),
    (End.TIMEOUT, ALO, MATCHES_LAST, F, "timeout"),
    (End.STALLED, ALO, FIRST, F, "stalled"),
    (End.TIMEOUT, AMO, MATCHES, F, "timeout"),
    (End.STALLED, AMO, FIRST, F, "stalled"),
    (End.TIMEOUT, RECOVER, FIRST, R, "timeout"),
    (End.STALLED, RECOVER, FIRST, R, "stalled"),
    (End.TIMEOUT, ALO_WITH_HOOK, FIRST, F, "timeout"),
    # a sync handler's thread that could not be stopped: unknown, whatever the delivery
    (End.TIMEOUT, ALO, STUCK, R, "timeout"),
    (End.STALLED, AMO, STUCK, R, "stalled"),
    (End.TIMEOUT, RECOVER, STUCK, R, "timeout"),
    # an isolated child lost
    (End.CRASHED, ALO, FIRST, F, "handler crashed"),
    (End.CRASHED, AMO, FIRST, F, "handler crashed"),
    (End.CRASHED, RECOVER, FIRST, R, "handler crashed"),
    (End.MEMORY, ALO, FIRST, F, "memory limit"),
    (End.MEMORY, AMO, FIRST, F, "memory limit"),
    (End.MEMORY, RECOVER, FIRST, R, "memory limit"),
    # a cancel request that reached the running handler
    (End.CANCELLED, ALO, FIRST, C, "cancel requested"),
    (End.CANCELLED, AMO, FIRST, C, "cancel requested"),
    (End.CANCELLED, RECOVER, FIRST, R, "cancel requested"),
    # the daemon's stop and its fence
    (End.SHUTDOWN, ALO, FIRST, Q, "shutdown"),
    (End.SHUTDOWN, ALO, LAST, F, "shutdown"),
    (End.SHUTDOWN, AMO, FIRST, F, "shutdown"),
    (End.SHUTDOWN, RECOVER, FIRST, R, "shutdown"),
    (End.FENCED, ALO, FIRST, Q, "fenced"),
    (End.FENCED, ALO, LAST, F, "fenced"),
    (End.FENCED, AMO, FIRST, F, "fenced"),
    (End.FENCED, RECOVER, FIRST, R, "fenced"),
    (End.SHUTDOWN, ALO, CANCEL, C, "cancel requested"),
    (End.FENCED, RECOVER, CANCEL, R, "cancel requested"),
    # rescues of a dead or unresponsive owner's runs
    (End.OWNER_DIED, ALO, FIRST, Q, "owner died"),
    (End.OWNER_DIED, ALO, LAST, F, "max attempts exceeded: owner died at attempt 3 of 3"),
    (End.OWNER_UNRESPONSIVE, ALO, FIRST, Q, "owner unresponsive"),
    (
        End.OWNER_UNRESPONSIVE,
        ALO,
        LAST,
        F,
        "max attempts exceeded: owner unresponsive at attempt 3 of 3",
    ),
    (End.OWNER_DIED, AMO, FIRST, F, "worker lost"),
    (End.OWNER_UNRESPONSIVE, AMO, FIRST, F, "worker lost"),
    (End.OWNER_DIED, RECOVER, FIRST, R, "worker lost"),
    (End.OWNER_UNRESPONSIVE, RECOVER, FIRST, R, "worker lost"),
    (End.OWNER_DIED, ALO, CANCEL, C, "cancel requested"),
    (End.OWNER_DIED, AMO, CANCEL, C, "cancel requested"),
    (End.OWNER_DIED, RECOVER, CANCEL, R, "cancel requested"),
    # a recover hook asking for a rerun
    (End.RERUN, RECOVER, FIRST, Q, "recovered: rerun"),
    (
        End.RERUN,
        RECOVER,
        LAST,
        F,
        "max attempts exceeded: the recover hook asked for a rerun at attempt 3 of 3",
    ),
    (End.RERUN, RECOVER, CANCEL, C, "cancel requested"),
    (End.RERUN, RECOVER, STUCK, R, "rerun refused: still running"),
]


@pytest.mark.parametrize(
    ("end", "rules", "facts", "status", "reason"),
    TABLE,
    ids=[
        f"{t[0].name}-{t[1].delivery}{'+hook' if t[1].recover else ''}-{i}"
        for i, t in enumerate(TABLE)
    ],
)
def test_each_end_becomes_one_state(
    end: End, rules: Rules, facts: Facts, status: JobStatus, reason: str
) -> None:
    verdict = decide(end, rules, facts)
    assert (verdict.status, verdict.reason) == (status, reason)


def test_every_end_is_in_the_table_for_every_delivery() -> None:
    covered = {(end, rules.delivery, rules.recovers) for end, rules, *_ in TABLE}
    for end in End:
        if end in (End.REJECTED, End.RERUN):
            continue
        for rules in (ALO, AMO, RECOVER):
            assert (end, rules.delivery, rules.recovers) in covered, (end, rules)


def test_the_causes_jobsd_decides_are_kept_in_the_error() -> None:
    assert decide(End.OWNER_DIED, AMO, FIRST).error == "worker lost: owner died at attempt 1"
    assert decide(End.OWNER_DIED, RECOVER, FIRST).error == "worker lost: owner died at attempt 1"
    exhausted = decide(End.OWNER_UNRESPONSIVE, ALO, LAST)
    assert exhausted.error == exhausted.reason
    assert decide(End.OWNER_DIED, ALO, FIRST).error is None  # a requeue keeps the old one
    assert str(decide(End.FENCED, AMO, FIRST).error).startswith("fenced: the daemon could not")
    assert str(decide(End.SHUTDOWN, ALO, LAST).error).startswith("interrupted: the daemon")
    assert decide(End.CANCELLED, RECOVER, FIRST).error == "cancelled while running: outcome unknown"
    # a handler's own failure: its error is the caller's
    assert decide(End.RAISED, ALO, FIRST).error is None


def test_a_rejected_result_fails_with_the_callers_reason_even_when_a_policy_matches() -> None:
    verdict = decide(End.REJECTED, ALO, MATCHES, reason="report too large")
    assert verdict == Verdict(F, "report too large")
