"""What a finished run turns into: an Outcome for the completer, with a capped error and,
when the run ended in an error, the record of its attempt (``jobs.errors``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobsd.jsonsafe import ERROR_MAX_BYTES, cap_error, encode_object, error_record

# ERROR_MAX_BYTES and cap_error live in jsonsafe (the one 2 KiB cap); re-exported here
__all__ = [
    "ERROR_MAX_BYTES",
    "Outcome",
    "cap_error",
    "error_cause_of",
    "error_record_of",
    "failure",
]


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
    record: dict[str, Any] | None = None
    """the attempt's error record (``jsonsafe.error_record``), made by ``failure``; an
    outcome with an error and no record gets one from its error and reason when
    written (``error_record_of``)"""


def failure(
    error: str,
    *,
    reason: str,
    detail: dict[str, Any] | None = None,
    cause: str | None = None,
) -> Outcome:
    """Build a failed outcome; the full text and ``detail`` go into the report, and
    into the attempt's error record its type and traceback (``detail``'s, if any).

    ``cause``: why the attempt ended, when ``reason`` will say something else (the
    reason of a retry is ``retry``); ``reason`` by default.
    """
    reported: dict[str, Any] = {"message": error, **(detail or {})}
    report = encode_object({"error": reported}, what="failure report", max_bytes=None)
    record = error_record(
        error,
        cause=cause or reason,
        type=_text(reported.get("type")),
        traceback=_text(reported.get("traceback")),
    )
    return Outcome(
        status="failed", report_json=report, error=cap_error(error), reason=reason, record=record
    )


def error_record_of(outcome: Outcome) -> dict[str, Any] | None:
    """Return the error record of the attempt ``outcome`` ends: its own, else one made of
    its error and reason (an end jobsd decided, such as a stop's); None for an outcome
    without an error (every success): nothing is recorded then."""
    if outcome.error is None:
        return None
    if outcome.record is not None:
        return outcome.record
    return error_record(outcome.error, cause=outcome.reason or "error")


def error_cause_of(outcome: Outcome) -> str | None:
    """Return the cause of the error record ``error_record_of`` gives ``outcome``
    without building the record; None when it gives none."""
    if outcome.error is None:
        return None
    if outcome.record is not None:
        return str(outcome.record["cause"])
    return outcome.reason or "error"


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
