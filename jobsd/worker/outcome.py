"""What a finished run turns into: an Outcome for the completer, with a capped error."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobsd.jsonsafe import ERROR_MAX_BYTES, cap_error, encode_object

# ERROR_MAX_BYTES and cap_error live in jsonsafe (the one 2 KiB cap); re-exported here
__all__ = ["ERROR_MAX_BYTES", "Outcome", "cap_error", "failure"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to write for a finished run."""

    status: str
    report_json: str | None = None
    error: str | None = None
    reason: str | None = None
    run_after: datetime | None = None
    delay_s: float | None = None
    """for a ``scheduled`` outcome: run again this long after the write (database clock)"""


def failure(error: str, *, reason: str, detail: dict[str, Any] | None = None) -> Outcome:
    """Build a failed outcome; the full text and ``detail`` go into the report."""
    cause: dict[str, Any] = {"message": error, **(detail or {})}
    report = encode_object({"error": cause}, what="failure report", max_bytes=None)
    return Outcome(status="failed", report_json=report, error=cap_error(error), reason=reason)
