"""Fixtures of the fault campaign: a throwaway cluster per module, a database and a
``Scenario`` per test, and the report every scenario appends its figures to.

Selection (tests/faults/README.md): every test here is marked ``faults``, a tier of its
own that ``uv run pytest`` leaves out (the suite stays under 15 minutes on 2 cores).
The quick subset (one scenario per fault family) runs when the command names this
folder (``uv run pytest tests/faults``, which ``.ci/run`` runs after the suite) or with
``JOBSD_TEST_FAULTS=quick``; the scenarios marked ``full_campaign`` too with
``JOBSD_TEST_FAULTS=all``, a ``-m`` expression that names ``faults`` (``uv run pytest
-m faults``), or ``bench/faults.py``. ``JOBSD_FAULTS_ONLY=T1,T4`` keeps those scenarios only. With
``JOBSD_FAULTS_REPORT=<file>`` each scenario's outcome and figures are appended to that
file as one JSON line (bench/faults.py reads it).
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psycopg
import pytest
from harness import Campaign, Check, Scenario
from proxy import Proxy
from psycopg import sql

from jobsd.dev.embedded import EmbeddedPostgres
from jobsd.store.migrate import migrate_sync

FAULTS_DIR = Path(__file__).resolve().parent
SELECT_ENV = "JOBSD_TEST_FAULTS"
REPORT_ENV = "JOBSD_FAULTS_REPORT"
SEED_ENV = "JOBSD_FAULTS_SEED"
ONLY_ENV = "JOBSD_FAULTS_ONLY"
FIGURES = pytest.StashKey[dict[str, Any]]()
CALL_REPORT = pytest.StashKey[pytest.TestReport]()


def _ours(item: pytest.Item) -> bool:
    return FAULTS_DIR in Path(str(item.path)).parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the campaign ``faults``; leave the full campaign out unless it was asked for."""
    full = os.environ.get(SELECT_ENV, "").lower() in ("all", "1", "full") or "faults" in (
        config.option.markexpr or ""
    )
    Campaign.full = full
    asked = [Path(a.split("::")[0]).resolve() for a in config.args]
    quick = os.environ.get(SELECT_ENV, "").lower() == "quick" or any(
        a == FAULTS_DIR or FAULTS_DIR in a.parents for a in asked
    )
    only = [s.strip() for s in os.environ.get(ONLY_ENV, "").split(",") if s.strip()]
    kept, dropped = [], []
    for item in items:
        if _ours(item):
            item.add_marker(pytest.mark.faults)
            if not (full or quick):
                dropped.append(item)
                continue
            if not full and item.get_closest_marker("full_campaign") is not None:
                dropped.append(item)
                continue
            if only and not any(_selects(sel, _scenario_id(item)) for sel in only):
                dropped.append(item)
                continue
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _scenario_id(item: pytest.Item) -> str:
    marker = item.get_closest_marker("scenario")
    return str(marker.args[0]) if marker else item.name


def _selects(selector: str, sid: str) -> bool:
    """``T2`` selects T2a and T2b, ``T1`` selects T1 and T1-orphans but not T10."""
    if sid == selector:
        return True
    rest = sid[len(selector) :] if sid.startswith(selector) else ""
    return bool(rest) and not rest[0].isdigit()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report: pytest.TestReport = yield
    if _ours(item):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            item.stash[CALL_REPORT] = report
        if report.when == "teardown":
            _write_report(item, report)
    return report


def _outcome(report: pytest.TestReport | None) -> tuple[str, str]:
    if report is None:
        return "error", ""
    xfail = getattr(report, "wasxfail", None)
    if xfail is not None:
        return ("xfailed" if report.skipped else "xpassed"), str(xfail)
    if report.skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        return "skipped", reason.removeprefix("Skipped: ")
    if report.failed:
        text = str(report.longrepr)
        lines = [ln for ln in text.splitlines() if ln.startswith("E ")]
        return "failed", (" ".join(ln[1:].strip() for ln in lines[:3]) or text[-300:])
    return "passed", ""


def _write_report(item: pytest.Item, teardown: pytest.TestReport) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    marker = item.get_closest_marker("scenario")
    sid, title = (marker.args[0], marker.args[1]) if marker else (item.name, "")
    call = item.stash.get(CALL_REPORT, None)
    outcome, reason = _outcome(call)
    if teardown.failed and outcome == "passed":
        outcome, reason = "error", "teardown failed"
    figures = dict(item.stash.get(FIGURES, {}))
    checks = [asdict(c) if isinstance(c, Check) else c for c in figures.pop("checks", [])]
    line = {
        "id": sid,
        "title": title,
        "test": item.nodeid,
        "outcome": outcome,
        "reason": reason,
        "duration_s": round(call.duration, 2) if call is not None else None,
        "figures": figures,
        "checks": checks,
        "seed": os.environ.get(SEED_ENV),
    }
    with open(path, "a") as fh:
        fh.write(json.dumps(line, default=str) + "\n")


@pytest.fixture
def proxy(fault_cluster: EmbeddedPostgres) -> Iterator[Proxy]:
    """A proxy in front of the module's cluster."""
    p = Proxy("127.0.0.1", fault_cluster.port)
    p.start()
    yield p
    p.close()


@pytest.fixture(scope="module")
def fault_cluster() -> Iterator[EmbeddedPostgres]:
    """Start a throwaway cluster for the module (as an unprivileged user, a free port)."""
    with EmbeddedPostgres() as cluster:
        yield cluster


def create_database(admin_url: str, name: str, template: str | None = None) -> None:
    """Create database ``name`` (optionally from ``template``)."""
    stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        stmt += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(stmt)


@pytest.fixture(scope="module")
def fault_template(fault_cluster: EmbeddedPostgres) -> str:
    """Migrate a template database on the module's cluster once; return its name."""
    name = f"faults_tpl_{uuid.uuid4().hex[:8]}"
    create_database(fault_cluster.url(), name)
    migrate_sync(fault_cluster.url(name))
    return name


@pytest.fixture
def fault_db(fault_cluster: EmbeddedPostgres, fault_template: str) -> str:
    """Create a fresh migrated database for the test; return its URL."""
    name = f"faults_{uuid.uuid4().hex[:12]}"
    if not fault_cluster.running:  # a scenario before this one left it stopped
        fault_cluster.start()
    create_database(fault_cluster.url(), name, template=fault_template)
    return fault_cluster.url(name)


@pytest.fixture
def workdir(shared_tmp: Path) -> Path:
    """A temp dir every process of the test can traverse (the ledger lives here)."""
    return shared_tmp


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The figures the test records for the report."""
    request.node.stash[FIGURES] = {}
    return request.node.stash[FIGURES]


@pytest.fixture
def scenario(fault_db: str, workdir: Path, figures: dict[str, Any]) -> Iterator[Scenario]:
    """A scenario on a fresh database; its processes are killed at teardown."""
    scn = Scenario(fault_db, workdir, figures)
    t0 = time.monotonic()
    try:
        yield scn
    finally:
        scn.close()
        figures.setdefault("wall_s", round(time.monotonic() - t0, 1))


@pytest.fixture
def rng() -> random.Random:
    """Randomized timing: seeded from JOBSD_FAULTS_SEED (printed), else a fixed seed."""
    seed = int(os.environ.get(SEED_ENV, "0"))
    print(f"fault timing seed {seed}")
    return random.Random(seed)
