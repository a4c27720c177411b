"""Which run ends count as errors in ``jobsd_job_errors``, under which cause."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jobsd.worker.outcome import Outcome, failure
from jobsd.worker.stats import ERROR_CAUSES, OTHER_CAUSE, OTHER_TYPE, DaemonStats, error_cause


def retried(failed: Outcome) -> Outcome:
    """Return ``failed`` as the retry policy turns it: scheduled, reason ``retry``."""
    return replace(failed, status="scheduled", reason="retry")


@pytest.mark.parametrize(
    ("outcome", "cause"),
    [
        (Outcome("succeeded"), None),
        (Outcome("cancelled", reason="cancel requested"), None),
        # an at_most_once type with a recover hook, cancelled mid-run: its outcome is
        # unknown, and the attempt's record says why
        (
            Outcome("recovery_required", reason="cancel requested", error="unknown"),
            "cancel requested",
        ),
        # a stop put it back, attempts left: nothing went wrong with the job
        (Outcome("queued", reason="shutdown"), None),
        (Outcome("queued", reason="fenced"), None),
        (failure("ValueError: bad row", reason="handler error"), "handler error"),
        # a retry keeps the record of the failure it retries, and so its cause
        (retried(failure("ConnectionError: reset", reason="handler error")), "handler error"),
        (retried(failure("timeout after 5 s", reason="timeout")), "timeout"),
        (retried(failure("stalled: no progress for 9 s", reason="stalled")), "stalled"),
        (failure("timeout after 5 s", reason="timeout"), "timeout"),
        (Outcome("recovery_required", reason="timeout", error="timeout after 5 s"), "timeout"),
        (failure("stalled: no progress for 9 s", reason="stalled"), "stalled"),
        (
            failure("handler process killed by signal SIGSEGV (11)", reason="handler crashed"),
            "handler crashed",
        ),
        (failure("memory limit: ...", reason="memory limit"), "memory limit"),
        (failure("unknown type 'x'", reason="unknown type"), "unknown type"),
        (failure("report too large", reason="report too large"), "report too large"),
        (failure("not JSON", reason="invalid report"), "invalid report"),
        (failure("progress too large", reason="progress too large"), "progress too large"),
        (failure("interrupted", reason="shutdown"), "shutdown"),
        (failure("fenced", reason="fenced"), "fenced"),
        (failure("something new", reason="a reason jobsd adds later"), OTHER_CAUSE),
    ],
)
def test_error_cause(outcome: Outcome, cause: str | None) -> None:
    assert error_cause(outcome) == cause
    assert cause is None or cause == OTHER_CAUSE or cause in ERROR_CAUSES


def test_errors_by_type_are_bounded_like_the_other_type_labels() -> None:
    stats = DaemonStats(known=lambda type_: type_ != "unregistered", max_types=2)
    boom = failure("ValueError: x", reason="handler error")
    for type_ in ("a", "b", "c", "unregistered", "a"):
        stats.count_error(type_, boom)
    stats.count_error("a", Outcome("succeeded"))
    assert stats.errors == {
        ("a", "handler error"): 2,
        ("b", "handler error"): 1,
        (OTHER_TYPE, "handler error"): 2,
    }
