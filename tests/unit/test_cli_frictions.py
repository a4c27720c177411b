"""Frictions of issue 14: ``--run-after`` and ``--since`` read ISO 8601 (Z, offsets, naive =
UTC) and durations; JSON log lines carry a timestamp."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click
import pytest

from jobsd.cli.common import Moment


@pytest.mark.parametrize(
    "text",
    [
        "2030-01-01T00:00:00Z",
        "2030-01-01T02:00:00+02:00",
        "2029-12-31T19:00:00-05:00",
        "2030-01-01T00:00:00",
        "2030-01-01",
        "2030-01-01 00:00:00+00:00",
    ],
)
def test_iso_8601_with_or_without_an_offset(text: str) -> None:
    assert Moment().convert(text, None, None) == datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("10m", 600), ("2h", 7200), ("3d", 259200)]
)
def test_durations_ahead_or_ago(text: str, seconds: int) -> None:
    now = datetime.now(UTC)
    ahead = Moment().convert(text, None, None) - now
    ago = now - Moment(ago=True).convert(text, None, None)
    for delta in (ahead, ago):
        assert abs(delta - timedelta(seconds=seconds)) < timedelta(seconds=5)


@pytest.mark.parametrize("text", ["soon", "", "2030-13-01", "-5m", "3x"])
def test_anything_else_is_a_usage_error(text: str) -> None:
    with pytest.raises(click.BadParameter, match="is not a time"):
        Moment().convert(text, None, None)


def test_json_log_lines_carry_a_timestamp() -> None:
    import json
    import logging

    from jobsd.logs import JsonFormatter

    record = logging.makeLogRecord({"msg": "job.rescued", "levelname": "INFO", "job_id": "x"})
    line = json.loads(JsonFormatter().format(record))
    assert list(line)[:3] == ["ts", "level", "event"] and line["job_id"] == "x"
    assert datetime.fromisoformat(line["ts"]) == datetime.fromtimestamp(
        record.created, UTC
    ).replace(microsecond=datetime.fromtimestamp(record.created, UTC).microsecond // 1000 * 1000)
