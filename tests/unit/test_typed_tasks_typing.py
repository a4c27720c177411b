"""``mypy --strict`` on a user's module (tests/typing_cases/typed_tasks.py): a Task's
enqueue takes its model, or a dict, and the options of every enqueue; another model,
a misspelt option or the wrong kind of client is reported.

mypy's cache lives in pytest's temporary directory, kept between sessions: the first
run checks jobsd and its dependencies (seconds), later ones only what changed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mypy import api

CASE = Path(__file__).resolve().parents[1] / "typing_cases" / "typed_tasks.py"
_MARK = re.compile(r"#\s*error:\s*(.+)$")


def _expected() -> dict[int, str]:
    """Map each line marked ``# error: TEXT`` to TEXT."""
    lines = CASE.read_text().splitlines()
    return {n: m.group(1).strip() for n, line in enumerate(lines, 1) if (m := _MARK.search(line))}


def test_mypy_accepts_the_right_calls_and_reports_the_wrong_ones(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    cache = tmp_path_factory.getbasetemp().parent / "jobsd-mypy-cache"
    out, err, status = api.run(
        ["--strict", "--python-version", "3.11", "--cache-dir", str(cache), str(CASE)]
    )
    assert err == "", err
    reported: dict[int, list[str]] = {}
    for line in out.splitlines():
        match = re.match(r"(.+):(\d+): error: (.*)", line)
        if match and Path(match.group(1)).resolve() == CASE:
            reported.setdefault(int(match.group(2)), []).append(match.group(3))
    expected = _expected()
    assert status == 1 and len(expected) == 6, out
    assert sorted(reported) == sorted(expected), out
    for number, text in expected.items():
        assert any(text in message for message in reported[number]), (number, reported[number])
