"""What a type's ``recover(job)`` hook answers for a job whose owner died mid-run.

The publish-then-acknowledge recovery: an ``at_most_once`` job must not run
again when its outcome is unknown, but the type may be able to find out (did the
message get published?). The sweeper moves the job to ``recovery_required`` first,
then calls the hook and applies its answer; if the hook fails or the sweeper dies
meanwhile, the job stays ``recovery_required`` for an operator (``jobsd resolve``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["AMBIGUOUS", "RERUN", "Recovery", "succeeded"]

RecoveryAction = Literal["succeeded", "ambiguous", "rerun"]


@dataclass(frozen=True, slots=True)
class Recovery:
    """A recover hook's answer."""

    action: RecoveryAction
    report: dict[str, Any] | None = None


def succeeded(report: dict[str, Any] | None = None) -> Recovery:
    """The work was done: the job becomes ``succeeded`` (reason ``recovered_after_publish``)."""
    return Recovery("succeeded", report)


AMBIGUOUS = Recovery("ambiguous")
"""Cannot tell: the job stays ``recovery_required`` until an operator resolves it."""

RERUN = Recovery("rerun")
"""Safe to run again: back to ``queued`` while attempts remain, else ``failed``."""
