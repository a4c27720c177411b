"""The history checker itself: it must be able to fail, or every test using it proves nothing."""

from __future__ import annotations

from typing import Any

import pytest
from support.history import history_problems


def ev(job: str, frm: str | None, to: str, attempt: int) -> dict[str, Any]:
    return {"job_id": job, "from_status": frm, "to_status": to, "attempt": attempt}


GOOD = [
    ev("a", None, "queued", 0),
    ev("a", "queued", "running", 1),
    ev("a", "running", "queued", 1),
    ev("a", "queued", "running", 2),
    ev("a", "running", "succeeded", 2),
]


def test_a_complete_chain_passes() -> None:
    assert history_problems([{"id": "a", "status": "succeeded", "attempts": 2}], GOOD) == []


def test_a_discard_note_is_not_a_transition() -> None:
    note = {**ev("a", "running", "running", 2), "reason": "result discarded: lease lost"}
    events = [*GOOD[:4], note, GOOD[4]]
    assert history_problems([{"id": "a", "status": "succeeded", "attempts": 2}], events) == []
    # the zombie's note may come after the job ended (swept, then run by another)
    late = [*GOOD, {**ev("a", "succeeded", "succeeded", 2), "reason": note["reason"]}]
    assert history_problems([{"id": "a", "status": "succeeded", "attempts": 2}], late) == []
    silent = [*GOOD[:4], ev("a", "running", "running", 2), GOOD[4]]
    problems = history_problems([{"id": "a", "status": "succeeded", "attempts": 2}], silent)
    assert any("without a discard note" in p for p in problems), problems


@pytest.mark.parametrize(
    ("job", "events", "expected"),
    [
        ({"id": "a", "status": "succeeded", "attempts": 2}, GOOD[:2] + GOOD[3:], "gap"),
        ({"id": "a", "status": "succeeded", "attempts": 2}, GOOD[1:], "first event"),
        ({"id": "a", "status": "failed", "attempts": 2}, GOOD, "last event ends"),
        ({"id": "a", "status": "succeeded", "attempts": 3}, GOOD, "attempt"),
        ({"id": "a", "status": "queued", "attempts": 0}, [], "no events"),
        (
            {"id": "a", "status": "running", "attempts": 2},
            [*GOOD, ev("a", "succeeded", "running", 2)],
            "left terminal",
        ),
        (
            {"id": "a", "status": "running", "attempts": 3},
            [ev("a", None, "queued", 0), ev("a", "queued", "running", 3)],
            "claim did not count",
        ),
        (
            {"id": "a", "status": "succeeded", "attempts": 0},
            [ev("a", None, "queued", 0), ev("a", "queued", "succeeded", 0)],
            "illegal transition",
        ),
        (
            {"id": "a", "status": "running", "attempts": 1},
            [ev("a", None, "running", 1)],
            "born",
        ),
    ],
    ids=["gap", "no-start", "wrong-end", "attempts", "none", "terminal", "claim", "edge", "born"],
)
def test_a_broken_chain_is_reported(
    job: dict[str, Any], events: list[dict[str, Any]], expected: str
) -> None:
    problems = history_problems([job], events)
    assert any(expected in p for p in problems), problems
