"""The newsletter's tests: Django's test client on the database of jobsd's test plugin.

``jobsd.testing`` makes a throwaway migrated database for the session and empties its
jobs before each test (``jobsd_db``); the site's tables live in the same database, as
in production, so a view's transaction holds both its rows and its jobs.
"""

import os
from collections.abc import Iterator

import pytest

pytest_plugins = ["jobsd.testing"]


@pytest.fixture(scope="session", autouse=True)
def django_site(jobsd_session_db) -> None:
    """Set Django up on the session's database and create the site's tables."""
    os.environ["DATABASE_URL"] = jobsd_session_db.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "newsletter.settings")
    import django
    from django.core.management import call_command
    from django.test.utils import setup_test_environment

    django.setup()
    setup_test_environment()
    call_command("migrate", verbosity=0)


@pytest.fixture(autouse=True)
def no_subscribers(jobsd_db) -> Iterator[None]:
    """Start each test with no subscriber (jobsd_db empties the jobs)."""
    from django.db import connection

    from signups.models import Subscriber

    Subscriber.objects.all().delete()
    yield
    connection.close()  # the test's connection, before the next test's reset


@pytest.fixture
def client():
    from django.test import Client

    return Client()
