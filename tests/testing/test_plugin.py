"""The plugin as a user enables it (``pytest -p jobsd.testing``), in a pytest run of its
own: its fixtures, the isolation between tests, a readable failure, and a database of
its own on the server it is given (nothing else on that server is touched)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import jobsd
from jobsd.testing import JobsdDB

from .conftest import run_pytest

pytestmark = pytest.mark.timeout(120)

PROJECT_TESTS = """
import jobsd
import pytest


@jobsd.handler("count")
async def count(ctx):
    return {"n": ctx.payload["n"]}


def test_1_jobs_enqueued_without_a_url_run_on_drain(jobsd_db, jobsd_worker):
    for n in range(3):
        jobsd.enqueue_sync("count", {"n": n}, org_id="acme")
    assert [r.result for r in jobsd_worker.drain()] == [{"n": 0}, {"n": 1}, {"n": 2}]
    jobsd.enqueue_sync("count", {"n": 9}, org_id="acme")  # left for the next test


def test_2_a_test_begins_with_an_empty_queue(jobsd_db):
    assert jobsd_db.enqueued_jobs() == []
    with jobsd.SyncClient() as client:  # no URL: the test's database
        assert client.list().jobs == []
        client.enqueue("count", {"n": 1}, org_id="acme")
    jobsd_db.assert_enqueued("count", {"n": 1}, count=1)


@pytest.mark.anyio
async def test_3_async_clients_reach_the_test_database(jobsd_db, jobsd_worker):
    async with jobsd.Client() as client:
        await client.enqueue("count", {"n": 1}, org_id="acme")
    await jobsd.enqueue("count", {"n": 2}, org_id="acme")
    ran = await jobsd_worker.drain_async()
    assert [(r.status, r.result) for r in ran] == [
        ("succeeded", {"n": 1}),
        ("succeeded", {"n": 2}),
    ]


def test_4_a_missing_job_is_told_with_what_was_enqueued(jobsd_db):
    jobsd.enqueue_sync("count", {"n": 1}, org_id="acme")
    jobsd_db.assert_enqueued("count", {"n": 2})
"""


def plugin_databases(admin_url: str) -> set[str]:
    """Return the names of the databases jobsd.testing made on the server."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'jobsd\\_test\\_%'"
        ).fetchall()
    return {row[0] for row in rows}


def test_the_plugin_isolates_tests_and_fails_readably_on_a_database_of_its_own(
    admin_url: str, jobsd_db: JobsdDB, tmp_path: Path
) -> None:
    # a job of this suite's own database, on the server the run is given
    mine = jobsd.enqueue_sync("suite_job", org_id="acme")
    before = plugin_databases(admin_url)
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_project.py").write_text(PROJECT_TESTS)

    run = run_pytest(
        ["-p", "anyio", "-p", "jobsd.testing", "-q"],
        cwd=project,
        admin_url=admin_url,
        report_dir=tmp_path,
    )

    assert {name: t.outcome for name, t in run.tests.items()} == {
        "test_1_jobs_enqueued_without_a_url_run_on_drain": "passed",
        "test_2_a_test_begins_with_an_empty_queue": "passed",
        "test_3_async_clients_reach_the_test_database[asyncio]": "passed",
        "test_4_a_missing_job_is_told_with_what_was_enqueued": "failed",
    }, run.output
    failure = run.tests["test_4_a_missing_job_is_told_with_what_was_enqueued"].message
    assert (
        "AssertionError: no job enqueued in this test matches type='count', payload "
        "containing {'n': 2}; enqueued in this test (1):\n"
        "  - count (org_id='acme', queue='default', status='queued') payload={'n': 1}\n"
        "      payload['n'] is 1, not 2"
    ) in failure, failure
    assert 'jobsd_db.assert_enqueued("count", {"n": 2})' in run.output  # the test's line
    # the run made its own database and dropped it; this suite's is as it was
    assert [job.id for job in jobsd_db.enqueued_jobs()] == [mine.id]
    assert plugin_databases(admin_url) == before
    assert jobsd_db.session.name in before


IMPORT_WITHOUT = """
import sys

import jobsd

for missing in ("anyio", "pytest"):
    for name in [m for m in sys.modules if m.startswith("jobsd.testing")]:
        del sys.modules[name]
    saved, sys.modules[missing] = sys.modules.get(missing), None
    try:
        import jobsd.testing
    except ImportError as exc:
        print(f"{missing}: {exc}")
    if saved is None:
        del sys.modules[missing]
    else:
        sys.modules[missing] = saved
"""


def test_without_the_server_extra_the_import_error_says_what_to_install() -> None:
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_WITHOUT], capture_output=True, text=True, check=True
    )

    assert run.stdout.splitlines() == [
        "anyio: jobsd.testing runs jobsd's daemon code in your tests and needs 'anyio': "
        "install jobsd with its server extra, `pip install 'jobsd[server]'` (and "
        "'jobsd[embedded]' where no Postgres binaries are installed)",
        "pytest: jobsd.testing is a pytest plugin: install pytest",
    ]
