"""What a finished run turns into: an Outcome for the completer, with a capped error."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobsd.jsonsafe import encode_object

__all__ = ["ERROR_MAX_BYTES", "Outcome", "cap_error", "failure"]

ERROR_MAX_BYTES = 2048


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


def cap_error(text: str) -> str:
    """Cut an error message to at most 2 KiB of UTF-8, on a character boundary."""
    data = text.encode("utf-8", "replace")
    if len(data) <= ERROR_MAX_BYTES:
        return text
    marker = " [truncated]"
    return data[: ERROR_MAX_BYTES - len(marker)].decode("utf-8", "ignore") + marker


def failure(error: str, *, reason: str, detail: dict[str, Any] | None = None) -> Outcome:
    """Build a failed outcome; the full text and ``detail`` go into the report."""
    cause: dict[str, Any] = {"message": error, **(detail or {})}
    report = encode_object({"error": cause}, what="failure report", max_bytes=None)
    return Outcome(status="failed", report_json=report, error=cap_error(error), reason=reason)
