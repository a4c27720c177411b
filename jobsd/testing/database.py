"""The database of a test session, and each test's view of it.

One database per test session (per pytest-xdist worker too), made by jobsd.testing
itself on the embedded cluster it starts (``jobsd.dev.embedded``, the one of ``jobsd
dev``) or on the server of ``JOBSD_TEST_DATABASE_URL``, migrated by jobsd's own
migrations and dropped at the end. Before each test it is put back as the
migrations left it (``jobsd.store.testing``): every test sees an empty queue.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from jobsd.errors import ConfigError
from jobsd.models import Job
from jobsd.store import testing as store
from jobsd.store.connect import trust_local_cluster
from jobsd.store.migrate import migrate_sync
from jobsd.testing.enqueued import Expected, no_match_message

__all__ = ["TEST_DATABASE_URL_ENV", "JobsdDB", "SessionDB", "database_server"]

TEST_DATABASE_URL_ENV = "JOBSD_TEST_DATABASE_URL"


@contextmanager
def database_server() -> Iterator[str]:
    """Yield a superuser URL of the server the session's database goes on: that of
    ``JOBSD_TEST_DATABASE_URL``, else an embedded cluster's, started now and removed
    on exit.

    Either is a throwaway server of the tests' own: its URL is trusted as ``jobsd dev``
    trusts its cluster's (no TLS or SCRAM asked for).
    """
    external = os.environ.get(TEST_DATABASE_URL_ENV)
    if external:
        trust_local_cluster(external)
        yield external
        return
    from jobsd.dev.embedded import EmbeddedPostgres

    try:
        cluster = EmbeddedPostgres()
    except ConfigError as exc:
        raise ConfigError(
            f"jobsd.testing cannot start a Postgres of its own: {exc}; or set "
            f"{TEST_DATABASE_URL_ENV} to a superuser URL of a Postgres server for the tests"
        ) from exc
    try:
        cluster.start()
        url = cluster.url()
        trust_local_cluster(url)
        yield url
    finally:
        cluster.cleanup()


class SessionDB:
    """The migrated database of a test session: ``url`` (on the server of
    ``server_url``), put back as the migrations left it by ``reset``."""

    def __init__(self, server_url: str, name: str) -> None:
        self.server_url = server_url
        self.name = name
        self.url = store.database_url(server_url, name)
        trust_local_cluster(self.url)
        store.create_database(server_url, name)
        try:
            migrate_sync(self.url)
            self._db = store.SessionDatabase(self.url)
        except BaseException:
            store.drop_database(server_url, name)
            raise

    @classmethod
    def create(cls, server_url: str) -> SessionDB:
        """Create and migrate a database of a name of its own on the server."""
        return cls(server_url, f"jobsd_test_{os.getpid()}_{uuid.uuid4().hex[:8]}")

    def reset(self) -> None:
        """Put the database back as the migrations left it (about a millisecond)."""
        self._db.reset()

    def jobs(self) -> list[Job]:
        """Return every job of the database, oldest first."""
        return self._db.list_jobs()

    def drop(self) -> None:
        """Drop the database, ending the sessions still on it."""
        self._db.close()
        store.drop_database(self.server_url, self.name)


class JobsdDB:
    """A test's view of the session's database, empty when the test began.

    ``url`` is ``JOBSD_DATABASE_URL`` for the test: ``jobsd.enqueue``, ``Client()`` and
    ``SyncClient()`` reach this database. Every job in it was enqueued in this test.
    """

    def __init__(self, session: SessionDB) -> None:
        self.session = session

    @property
    def url(self) -> str:
        """Return the database's URL."""
        return self.session.url

    def enqueued_jobs(
        self, type: str | None = None, payload: Mapping[str, Any] | None = None, **fields: Any
    ) -> list[Job]:
        """Return the jobs enqueued in this test that match (all without arguments),
        oldest first.

        ``payload`` matches the jobs whose payload holds its keys with equal values;
        ``fields`` are other fields of ``jobsd.Job`` (``queue``, ``org_id``, ``status``...).
        """
        expected = Expected(type, payload, fields)
        return [job for job in self.session.jobs() if expected.matches(job)]

    def assert_enqueued(
        self,
        type: str | None = None,
        payload: Mapping[str, Any] | None = None,
        *,
        count: int | None = None,
        **fields: Any,
    ) -> Job:
        """Assert that a job matching was enqueued in this test (exactly ``count`` of
        them, when given); return the first one.

        ``payload`` is a subset: each key given must be in the job's payload with an
        equal value, the others are not looked at (``unittest.mock.ANY`` matches any
        value). ``fields`` are other fields of ``jobsd.Job``, compared with ``==``. The
        failure lists every job enqueued in the test and how each differs.
        """
        __tracebackhide__ = True  # pytest: the failure points at the test's line
        if count is not None and count < 1:
            raise ValueError("count must be at least 1 (to see none: `not enqueued_jobs(...)`)")
        expected = Expected(type, payload, fields)
        jobs = self.session.jobs()
        matching = [job for job in jobs if expected.matches(job)]
        if not matching or (count is not None and len(matching) != count):
            raise AssertionError(no_match_message(expected, jobs, count=count))
        return matching[0]
