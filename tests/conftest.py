"""Shared fixtures: a throwaway Postgres server, a migrated template and a database per test.

Set ``JOBSD_TEST_DATABASE_URL`` (a superuser URL) to run against an existing server instead
of starting an embedded one; test databases are still created and dropped on it.

Each test is marked with its tier, the first folder under tests/ (``pytest -m unit``);
the helpers every tier shares live in tests/support (see tests/README.md).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.fixtures import anyio_backend as anyio_backend
from support.fixtures import empty_db_url as empty_db_url
from support.fixtures import shared_tmp as shared_tmp

from jobsd.dev.embedded import EmbeddedPostgres

TEST_DATABASE_URL_ENV = "JOBSD_TEST_DATABASE_URL"
# the heavy tests (mark ``heavy``): left out of a plain run, run by ``-m heavy`` or this
HEAVY_ENV = "JOBSD_TEST_HEAVY"
TESTS_DIR = Path(__file__).resolve().parent
# the folders of tests/ that are tiers; a test elsewhere (tests/test_*.py) has no tier mark
TIERS = (
    "unit",
    "db",
    "service",
    "http",
    "e2e",
    "security",
    "faults",
    "migrations",
    "scale",
    "release",
    "testing",
)


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: a test of tests/{tier}/ (tests/README.md)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier, so that ``-m`` can pick or leave out tiers; leave
    the ``heavy`` tests out unless they were asked for."""
    for item in items:
        try:
            tier = item.path.resolve().relative_to(TESTS_DIR).parts[0]
        except ValueError:
            continue
        if tier in TIERS:
            item.add_marker(tier)
    heavy_asked = os.environ.get(HEAVY_ENV, "").lower() in ("1", "yes", "all") or "heavy" in (
        config.option.markexpr or ""
    )
    if not heavy_asked:
        heavy = [item for item in items if item.get_closest_marker("heavy") is not None]
        if heavy:
            config.hook.pytest_deselected(items=heavy)
            items[:] = [item for item in items if item.get_closest_marker("heavy") is None]


def db_url_for(base_url: str, dbname: str) -> str:
    """Return ``base_url`` pointing at database ``dbname`` on the same server (a URL stays
    a URL, as SQLAlchemy needs; a conninfo stays a conninfo): jobsd.testing's rule."""
    from jobsd.store.testing import database_url

    return database_url(base_url, dbname)


def _admin_execute(admin_url: str, statement: sql.Composed) -> None:
    """Run one statement on the server's maintenance database in autocommit mode."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(statement)


def _create_database(admin_url: str, name: str, template: str | None = None) -> None:
    """Create database ``name``, optionally as a copy of ``template``."""
    stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        stmt += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    _admin_execute(admin_url, stmt)


def _drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name``, disconnecting anyone still on it."""
    _admin_execute(
        admin_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


@pytest.fixture(scope="session", autouse=True)
def allow_plaintext_test_server() -> Iterator[None]:
    """Set JOBSD_ALLOW_INSECURE=1 for the session: the test server is plaintext TCP.

    Every connection jobsd opens goes through its TLS policy (``jobsd.store.connect``);
    tests of the refusal set JOBSD_ALLOW_INSECURE=0 (or remove it) themselves.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JOBSD_ALLOW_INSECURE", "1")
        yield


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[EmbeddedPostgres | None]:
    """Start an embedded Postgres for the session, or None when an external URL is set."""
    if os.environ.get(TEST_DATABASE_URL_ENV):
        yield None
        return
    cluster = EmbeddedPostgres()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture(scope="session")
def admin_url(pg_cluster: EmbeddedPostgres | None) -> str:
    """Return a superuser URL of the server the tests use."""
    external = os.environ.get(TEST_DATABASE_URL_ENV)
    if external:
        return external
    assert pg_cluster is not None
    return pg_cluster.url()


@pytest.fixture(scope="session")
def template_db(admin_url: str) -> Iterator[str]:
    """Create a migrated template database for the session and drop it at the end."""
    from jobsd.store.migrate import migrate_sync

    name = f"jobsd_tpl_{uuid.uuid4().hex[:12]}"
    _create_database(admin_url, name)
    try:
        migrate_sync(db_url_for(admin_url, name))
        # CREATE DATABASE ... TEMPLATE fails while anyone is connected to the template:
        # disconnect leftovers and refuse new connections for the rest of the session.
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            admin.execute(
                sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(
                    sql.Identifier(name)
                )
            )
        yield name
    finally:
        _drop_database(admin_url, name)


@pytest.fixture
def db_url(admin_url: str, template_db: str) -> Iterator[str]:
    """Create a fresh migrated database for one test and drop it afterwards."""
    name = f"test_{uuid.uuid4().hex[:16]}"
    _create_database(admin_url, name, template=template_db)
    try:
        yield db_url_for(admin_url, name)
    finally:
        _drop_database(admin_url, name)


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """Open an autocommit connection to the test's database."""
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., EmbeddedPostgres]]:
    """Yield a factory of started ``EmbeddedPostgres`` clusters, all cleaned up afterwards."""
    clusters: list[EmbeddedPostgres] = []

    def factory(**kwargs: Any) -> EmbeddedPostgres:
        cluster = EmbeddedPostgres(**kwargs)
        clusters.append(cluster)
        cluster.start()
        return cluster

    yield factory
    errors: list[BaseException] = []
    for cluster in clusters:
        try:
            cluster.cleanup()
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
