"""jobsd.testing: a pytest plugin for the tests of applications that use jobsd.

Enable it in your tests' conftest.py (it is never loaded on its own)::

    pytest_plugins = ["jobsd.testing"]

or run ``pytest -p jobsd.testing``. Its fixtures:

- ``jobsd_db``: a migrated database, empty when the test begins, that is the test's
  ``JOBSD_DATABASE_URL``; ``assert_enqueued(...)`` and ``enqueued_jobs(...)`` look at
  what the test enqueued.
- ``jobsd_worker``: ``drain()`` (``await drain_async()`` in async tests) runs the
  queued jobs here, through the daemon's claim, handler call and outcome writes.
- ``jobsd_session_db``, ``jobsd_registry``: the session's database, the handlers run.

It runs jobsd's daemon code, so it needs the ``server`` extra (``pip install
'jobsd[server]'``), and Postgres binaries for its throwaway cluster (``jobsd[embedded]``
where none are installed) unless ``JOBSD_TEST_DATABASE_URL`` names a server. See
docs/testing.md.
"""

from __future__ import annotations

from jobsd.extras import SERVER_LIBRARIES

try:
    from jobsd.testing.database import TEST_DATABASE_URL_ENV, JobsdDB, SessionDB
    from jobsd.testing.drain import DrainLimitExceeded, JobResult, JobsdWorker
    from jobsd.testing.plugin import (
        jobsd_db,
        jobsd_registry,
        jobsd_session_db,
        jobsd_worker,
        pytest_addoption,
    )
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
    missing = (exc.name or "").split(".")[0]
    if missing == "pytest":
        raise ImportError(
            "jobsd.testing is a pytest plugin: install pytest", name=exc.name
        ) from exc
    if missing not in SERVER_LIBRARIES:
        raise
    raise ImportError(
        f"jobsd.testing runs jobsd's daemon code in your tests and needs {missing!r}: "
        "install jobsd with its server extra, `pip install 'jobsd[server]'` (and "
        "'jobsd[embedded]' where no Postgres binaries are installed)",
        name=exc.name,
    ) from exc

__all__ = [
    "TEST_DATABASE_URL_ENV",
    "DrainLimitExceeded",
    "JobResult",
    "JobsdDB",
    "JobsdWorker",
    "SessionDB",
    "jobsd_db",
    "jobsd_registry",
    "jobsd_session_db",
    "jobsd_worker",
    "pytest_addoption",
]
