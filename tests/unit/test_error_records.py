"""An attempt's error record: its caps (jsonsafe), how an outcome makes it, how a read
parses it, and a report's traceback set apart for front ends."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobsd.jsonsafe import (
    ERROR_LABEL_MAX_BYTES,
    ERROR_MAX_BYTES,
    TRACEBACK_MAX_BYTES,
    cap_traceback,
    error_record,
)
from jobsd.models import ErrorRecord, Job, JobStatus, error_records, split_traceback
from jobsd.worker.outcome import Outcome, error_record_of, failure

CUT = re.compile(r"^\[traceback cut: its first (\d+) bytes are not kept\]\n")


def a_traceback(size: int) -> str:
    """A traceback of about ``size`` bytes: numbered frames, then the exception."""
    lines = ["Traceback (most recent call last):"]
    frame = 0
    while sum(len(line) + 1 for line in lines) < size:
        lines.append(f'  File "/srv/app/step_{frame}.py", line {frame}, in step_{frame}')
        lines.append(f"    step_{frame + 1}(rows)")
        frame += 1
    lines.append("ValueError: the last line, the most useful one")
    return "\n".join(lines) + "\n"


def test_a_short_traceback_is_kept_whole() -> None:
    text = a_traceback(2000)
    assert cap_traceback(text) == text


def test_a_100_kb_traceback_keeps_its_end_after_a_line_saying_what_was_cut() -> None:
    text = a_traceback(100_000)
    size = len(text.encode())
    capped = cap_traceback(text)
    data = capped.encode()
    assert len(data) <= TRACEBACK_MAX_BYTES
    assert len(data) > TRACEBACK_MAX_BYTES - 200, "no more is cut than needed"
    found = CUT.match(capped)
    assert found, capped[:120]
    kept = capped[found.end() :]
    assert text.endswith(kept), "the end, exactly as it was"
    assert int(found.group(1)) == size - len(kept.encode()), "the count is exact"
    assert kept.startswith("  File ") or kept.startswith("    step_"), "from a line's start"
    assert capped.endswith("ValueError: the last line, the most useful one\n")


@given(st.text(min_size=1, max_size=40), st.integers(TRACEBACK_MAX_BYTES - 50, 60_000))
def test_a_cut_traceback_is_never_over_the_cap_and_its_count_is_exact(unit: str, size: int) -> None:
    # multi-byte characters (and lone surrogates, replaced) at any cut position
    text = (unit * (size // max(len(unit.encode("utf-8", "replace")), 1) + 1))[:size]
    capped = cap_traceback(text)
    data = capped.encode("utf-8")  # storable: no lone surrogate left
    assert len(data) <= TRACEBACK_MAX_BYTES
    found = CUT.match(capped)
    if found is None:
        assert "\x00" not in capped
        return
    kept = capped[found.end() :].encode()
    stored = text.replace("\x00", "\ufffd")
    stored = re.sub("[\ud800-\udfff]", "\ufffd", stored)
    whole = stored.encode()
    assert whole.endswith(kept)
    assert int(found.group(1)) == len(whole) - len(kept)


def test_a_record_caps_its_message_type_and_cause() -> None:
    record = error_record(
        "é" * 5000 + "\x00",
        cause="c" * 2000,
        type="pkg." + "T" * 2000,
        traceback=a_traceback(50_000),
    )
    assert set(record) == {"type", "message", "traceback", "cause"}
    assert len(record["message"].encode()) <= ERROR_MAX_BYTES
    assert record["message"].endswith(" [truncated]")
    assert len(record["type"].encode()) <= ERROR_LABEL_MAX_BYTES
    assert len(record["cause"].encode()) <= ERROR_LABEL_MAX_BYTES
    assert len(record["traceback"].encode()) <= TRACEBACK_MAX_BYTES
    json.dumps(record, allow_nan=False).encode()  # storable as it is


def test_a_10_kb_message_is_cut_to_2_kib() -> None:
    record = error_record("m" * 10_240, cause="handler error")
    assert len(record["message"].encode()) == ERROR_MAX_BYTES
    assert record["message"].startswith("m" * 100)
    assert record["traceback"] is None and record["type"] is None


def test_a_handler_failure_carries_its_record_into_a_retry() -> None:
    out = failure(
        "ValueError: boom",
        reason="handler error",
        detail={"type": "builtins.ValueError", "traceback": "Traceback ...\nValueError: boom\n"},
    )
    assert out.record == {
        "type": "builtins.ValueError",
        "message": "ValueError: boom",
        "traceback": "Traceback ...\nValueError: boom\n",
        "cause": "handler error",
    }
    assert error_record_of(out) is out.record
    # a stop's outcome has an error but no record of its own: one from error and reason
    stopped = Outcome(status="failed", error="interrupted", reason="shutdown")
    assert error_record_of(stopped) == {
        "type": None,
        "message": "interrupted",
        "traceback": None,
        "cause": "shutdown",
    }
    # a timeout that is retried: the record says timeout, the reason retry
    timed = failure("timeout after 1 s", reason="retry", cause="timeout")
    assert (timed.reason, timed.record and timed.record["cause"]) == ("retry", "timeout")


def test_a_success_has_no_record() -> None:
    assert error_record_of(Outcome(status="succeeded")) is None
    assert error_record_of(Outcome(status="queued", reason="shutdown")) is None


def test_records_are_read_most_recent_first_and_odd_elements_are_left_out() -> None:
    at = datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    stored = [
        {"attempt": 2, "at": at.isoformat(), "type": None, "message": "m2",
         "traceback": None, "cause": "timeout"},
        "not a record",
        {"attempt": "x", "at": at.isoformat()},
        {"at": at.isoformat()},
        {"attempt": 1, "at": "2030-01-02T03:04:05+01:00", "type": "builtins.OSError",
         "message": "m1", "traceback": "T\nOSError\n", "cause": "handler error"},
    ]  # fmt: skip
    records = error_records(stored)
    assert [r.attempt for r in records] == [2, 1]
    assert records[0] == ErrorRecord(2, at, None, "m2", None, "timeout")
    assert records[1].at.utcoffset() is not None
    assert records[1].to_json()["at"] == "2030-01-02T03:04:05+01:00"
    assert error_records(None) == [] and error_records({"attempt": 1}) == []


def test_a_job_row_reads_its_errors_and_shows_them_in_its_json() -> None:
    now = datetime.now(UTC)
    row = {
        "id": __import__("uuid").uuid4(), "org_id": "acme", "type": "t", "queue": "default",
        "status": "failed", "attempts": 1, "dedup_key": None, "payload": {},
        "progress": None, "report": None, "error": "e", "reason": "handler error",
        "run_after": now, "lease_id": None, "worker_id": None, "created_at": now,
        "started_at": now, "finished_at": now,
        "errors": [{"attempt": 1, "at": now.isoformat(), "type": None, "message": "e",
                    "traceback": None, "cause": "handler error"}],
    }  # fmt: skip
    job = Job.from_row(row)
    assert job.status is JobStatus.FAILED
    assert [r.message for r in job.errors] == ["e"]
    assert job.to_json()["errors"] == [
        {"attempt": 1, "at": now.isoformat(), "type": None, "message": "e",
         "traceback": None, "cause": "handler error"}
    ]  # fmt: skip
    assert Job.from_row({**row, "errors": None}).errors == []


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (None, (None, None)),
        ({"rows": 3}, ({"rows": 3}, None)),
        ({"error": "text"}, ({"error": "text"}, None)),
        ({"error": {"message": "m"}}, ({"error": {"message": "m"}}, None)),
        (
            {"error": {"message": "m", "type": "T", "traceback": "a\nb\n"}},
            ({"error": {"message": "m", "type": "T"}}, "a\nb\n"),
        ),
    ],
)
def test_a_reports_traceback_is_set_apart(
    report: dict[str, object] | None, expected: tuple[object, object]
) -> None:
    assert split_traceback(report) == expected
