"""The fixtures of the pytest plugin ``jobsd.testing``.

``jobsd_session_db`` (session) makes and migrates the session's database;
``jobsd_db`` empties it before the test and points ``JOBSD_DATABASE_URL`` at it;
``jobsd_worker`` runs its jobs (``drain``) with the handlers of ``jobsd_registry``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import jobsd
from jobsd.registry import Registry, default_registry
from jobsd.testing.database import JobsdDB, SessionDB, database_server
from jobsd.testing.drain import JobsdWorker

__all__ = [
    "jobsd_db",
    "jobsd_registry",
    "jobsd_session_db",
    "jobsd_worker",
    "pytest_addoption",
]

HANDLERS_INI = "jobsd_handlers"

# what a test's code reads to find its database, besides JOBSD_DATABASE_URL: unset for
# the test, so that every read and write goes to the test's database
_OTHER_URLS = (
    "JOBSD_READ_DATABASE_URL",
    "JOBSD_API_DATABASE_URL",
    "JOBSD_API_READ_DATABASE_URL",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Declare the ``jobsd_handlers`` ini option."""
    parser.addini(
        HANDLERS_INI,
        type="args",
        default=[],
        help="jobsd.testing: modules to import for jobsd_worker, whose @jobsd.handler "
        "functions it runs (as JOBSD_HANDLERS names them for a daemon)",
    )


@pytest.fixture(scope="session")
def jobsd_session_db() -> Iterator[SessionDB]:
    """Make the session's migrated database (on an embedded cluster started for the
    session, or the server of JOBSD_TEST_DATABASE_URL); drop it at the end."""
    with database_server() as server_url:
        session = SessionDB.create(server_url)
        try:
            yield session
        finally:
            jobsd.close()  # the default sync client's connections, before the drop
            session.drop()


@pytest.fixture
def jobsd_db(jobsd_session_db: SessionDB, monkeypatch: pytest.MonkeyPatch) -> JobsdDB:
    """Empty the session's database for this test and make it the test's
    ``JOBSD_DATABASE_URL``: jobsd.enqueue, Client() and SyncClient() reach it."""
    jobsd_session_db.reset()
    monkeypatch.setenv("JOBSD_DATABASE_URL", jobsd_session_db.url)
    for name in _OTHER_URLS:
        monkeypatch.delenv(name, raising=False)
    # the default sync client (jobsd.enqueue_sync) read its URL when it was made: it
    # is made again, for this database, on its next use
    jobsd.close()
    return JobsdDB(jobsd_session_db)


@pytest.fixture
def jobsd_registry() -> Registry:
    """Return the handlers jobsd_worker runs: the registry of ``@jobsd.handler``.

    Override it in a conftest.py to run those of a registry of your own.
    """
    return default_registry


@pytest.fixture
def jobsd_worker(
    jobsd_db: JobsdDB, jobsd_registry: Registry, pytestconfig: pytest.Config
) -> JobsdWorker:
    """Return a worker that runs the test's jobs in the test's process: ``drain()`` in a
    sync test, ``await drain_async()`` in an async one."""
    modules = pytestconfig.getini(HANDLERS_INI)
    return JobsdWorker(jobsd_db.url, registry=jobsd_registry, modules=modules)
