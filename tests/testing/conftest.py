"""Fixtures of the tests of ``jobsd.testing``, the pytest plugin: its own fixtures, on
the suite's server.

The plugin's ``jobsd_db`` is used as it is; ``jobsd_session_db`` is made on the server
of the suite (``admin_url``) rather than on a cluster of its own. The plugin as users
enable it (``pytest_plugins``, ``-p jobsd.testing``) runs in subprocesses
(``run_pytest``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import jobsd
from jobsd.registry import Registry
from jobsd.testing import JobsdDB, JobsdWorker, SessionDB
from jobsd.testing import jobsd_db as jobsd_db

TESTING_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTING_DIR.parents[1]


@pytest.fixture(scope="session")
def jobsd_session_db(admin_url: str) -> Iterator[SessionDB]:
    """Make the plugin's session database on the suite's server; drop it at the end."""
    session = SessionDB.create(admin_url)
    try:
        yield session
    finally:
        jobsd.close()
        session.drop()


@pytest.fixture
def registry() -> Registry:
    """Return an empty handler registry of the test's own."""
    return Registry()


@pytest.fixture
def worker(jobsd_db: JobsdDB, registry: Registry) -> JobsdWorker:
    """Return a worker on the test's database that runs the handlers of ``registry``."""
    return JobsdWorker(jobsd_db.url, registry=registry)


@dataclass(frozen=True)
class Outcome:
    """One test of a pytest run in a subprocess: its result and failure message."""

    outcome: str
    """``passed``, ``failed``, ``error`` or ``skipped``"""
    message: str


@dataclass(frozen=True)
class PytestRun:
    """A pytest run in a subprocess: its exit status, output and each test's outcome."""

    returncode: int
    output: str
    tests: dict[str, Outcome]


_OUTCOMES = {"failure": "failed", "error": "error", "skipped": "skipped"}


def run_pytest(
    args: list[str],
    *,
    cwd: Path,
    admin_url: str,
    report_dir: Path,
    env: dict[str, str] | None = None,
) -> PytestRun:
    """Run ``python -m pytest`` (this interpreter) in ``cwd`` with a JUnit XML report (in
    ``report_dir``), on the suite's server (``JOBSD_TEST_DATABASE_URL``: no second
    cluster is started).

    Plugins are not loaded on their own (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``): the run
    loads what its project names, not what jobsd's development environment installs.
    """
    report = report_dir / "pytest-report.xml"
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBSD_", "PYTEST_"))}
    run_env |= {
        "JOBSD_TEST_DATABASE_URL": admin_url,
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        **(env or {}),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={report}", *args],
        cwd=cwd,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = proc.stdout + proc.stderr
    tests: dict[str, Outcome] = {}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            outcome, message = "passed", ""
            for child in case:
                if child.tag in _OUTCOMES:
                    outcome = _OUTCOMES[child.tag]
                    message = child.get("message", "") + "\n" + (child.text or "")
            tests[case.get("name", "")] = Outcome(outcome, message)
    return PytestRun(proc.returncode, output, tests)
