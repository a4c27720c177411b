"""The Django tier: jobsd as the backend of Django's tasks, in a real Django project.

The project is the sample site ``examples/newsletter``. In this process Django is set
up once on a database of ``jobsd.testing`` (emptied before each test); the commands a
user runs (``manage.py migrate``, ``manage.py jobsd run``) run in subprocesses on
databases of their own. Left out of a plain ``uv run pytest``: it runs when this folder
is named (``uv run pytest tests/django``, which ``.ci/run`` runs), with
``JOBSD_TEST_DJANGO=1``, or with a ``-m`` expression naming ``django``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.tiers import leave_out_unless_asked

import jobsd
from jobsd.testing import JobsdDB, JobsdWorker, SessionDB
from jobsd.testing import jobsd_db as jobsd_db

DJANGO_DIR = Path(__file__).resolve().parent
REPO_ROOT = DJANGO_DIR.parents[1]
NEWSLETTER = REPO_ROOT / "examples" / "newsletter"
SELECT_ENV = "JOBSD_TEST_DJANGO"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the Django tier out unless it was asked for."""
    leave_out_unless_asked(config, items, DJANGO_DIR, SELECT_ENV, "django")


@pytest.fixture(scope="session")
def jobsd_session_db(admin_url: str) -> Iterator[SessionDB]:
    """The plugin's session database on the suite's server, with Django set up on it
    and the site's tables created (``manage.py migrate``, in this process)."""
    session = SessionDB.create(admin_url)
    try:
        _setup_django(session.url)
        yield session
    finally:
        from django.db import connections

        connections.close_all()
        jobsd.close()
        session.drop()


def _setup_django(url: str) -> None:
    for path in (str(NEWSLETTER), str(DJANGO_DIR)):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "site_settings"
    import django
    from django.core.management import call_command
    from django.test.utils import setup_test_environment

    django.setup()
    setup_test_environment()
    call_command("migrate", verbosity=0)


@pytest.fixture
def site(jobsd_db: JobsdDB) -> Iterator[JobsdDB]:
    """The test's database, with no subscriber and no job; Django's connection closed
    after the test."""
    from django.db import connection
    from signups.models import Subscriber

    Subscriber.objects.all().delete()
    yield jobsd_db
    connection.close()


@pytest.fixture
def worker(site: JobsdDB) -> JobsdWorker:
    """A worker running the project's tasks (and the tests' own) on the test's database."""
    import sitetasks  # noqa: F401  (its tasks are declared to the backend)

    from jobsd.contrib.django.handlers import register_tasks
    from jobsd.registry import Registry

    registry = Registry()
    register_tasks(registry)
    return JobsdWorker(site.url, registry=registry)


def count_jobs(url: str, **where: Any) -> int:
    """Count the jobs another connection sees (committed ones)."""
    import psycopg

    clause = " AND ".join(f"{name} = %({name})s" for name in where) or "true"
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM jobsd.jobs WHERE {clause}", where).fetchone()
    assert row is not None
    return int(row[0])
