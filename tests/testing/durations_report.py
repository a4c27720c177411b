"""A pytest plugin for the runs in a subprocess: each test's phases and what the set-up
of session fixtures took in them, written as JSON to ``$JOBSD_DURATIONS_REPORT``.

``{nodeid: {"setup": s, "call": s, "teardown": s, "session_fixtures": s}}``: the first
test's set-up includes the session's database (a cluster's start, a migration), which
``session_fixtures`` tells apart.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Generator
from typing import Any

import pytest

_phases: dict[str, dict[str, float]] = defaultdict(dict)
_session_s: dict[str, float] = defaultdict(float)
_depth = [0]
_current = [""]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _current[0] = item.nodeid


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any],
) -> Generator[None, None, None]:
    outermost = fixturedef.scope == "session" and _depth[0] == 0
    _depth[0] += fixturedef.scope == "session"
    start = time.perf_counter()
    try:
        yield
    finally:
        _depth[0] -= fixturedef.scope == "session"
        if outermost:
            _session_s[_current[0]] += time.perf_counter() - start


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _phases[report.nodeid][report.when] = report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("JOBSD_DURATIONS_REPORT")
    if path:
        report = {
            nodeid: {**phases, "session_fixtures": _session_s.get(nodeid, 0.0)}
            for nodeid, phases in _phases.items()
        }
        with open(path, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=1)
