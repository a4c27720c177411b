"""The commands a Django project runs: ``manage.py migrate`` creates jobsd's schema, and
``manage.py jobsd run`` runs the project's tasks to results Django reads back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg
import pytest
from support.proc import Proc

from jobsd.testing import JobsdDB

from .conftest import NEWSLETTER

pytestmark = pytest.mark.timeout(120)


def manage_env(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBSD_", "DJANGO_"))}
    # the suite's server listens on 127.0.0.1 without TLS
    env.update(DATABASE_URL=url, PYTHONUNBUFFERED="1", JOBSD_ALLOW_INSECURE="1", **extra)
    return env


def manage(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=NEWSLETTER,
        env=manage_env(url),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_manage_py_migrate_creates_jobsds_schema_with_the_sites(empty_db_url: str) -> None:
    migrated = manage(empty_db_url, "migrate")

    assert migrated.returncode == 0, migrated.stderr
    assert "Applying jobsd.0001_jobsd_schema... OK" in migrated.stdout
    assert "Applying jobsd.0002_jobsd_schema... OK" in migrated.stdout
    with psycopg.connect(empty_db_url) as conn:
        versions = conn.execute("SELECT count(*) FROM jobsd.schema_migrations").fetchone()
        tables = conn.execute(
            "SELECT to_regclass('jobsd.jobs') IS NOT NULL,"
            " to_regclass('public.signups_subscriber') IS NOT NULL"
        ).fetchone()
    from jobsd.store.sqlfiles import load_migrations

    assert versions == (len(load_migrations()),)
    assert tables == (True, True)
    again = manage(empty_db_url, "jobsd", "migrate")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "schema up to date"


def test_the_django_migration_reaches_the_latest_schema_migration() -> None:
    import importlib

    from jobsd.store.sqlfiles import load_migrations

    migrations = sorted(
        p.stem for p in (NEWSLETTER.parents[1] / "jobsd/contrib/django/migrations").glob("0*.py")
    )
    last = importlib.import_module(f"jobsd.contrib.django.migrations.{migrations[-1]}")
    assert max(m.version for m in load_migrations()) == last.SCHEMA_VERSION


def test_manage_py_jobsd_on_a_database_without_schema_says_to_migrate(empty_db_url: str) -> None:
    run = manage(empty_db_url, "jobsd", "run")

    assert run.returncode != 0
    assert "database schema is behind" in run.stderr
    assert "Traceback" not in run.stderr


def _results(ids: list[str], deadline_s: float = 30.0) -> list[Any]:
    from signups.tasks import send_welcome

    backend = send_welcome.get_backend()
    deadline = time.monotonic() + deadline_s
    while True:
        results = [backend.get_result(i) for i in ids]
        if all(r.is_finished for r in results) or time.monotonic() > deadline:
            return results
        time.sleep(0.05)


def test_manage_py_jobsd_run_runs_the_projects_tasks_by_priority(site: JobsdDB) -> None:
    from signups.models import Subscriber
    from signups.tasks import send_welcome, weekly_digest

    ada = Subscriber.objects.create(email="ada@example.com", plan="pro")
    # enqueued before the daemon starts, lowest priority first: one slot takes them
    # in Django's order, higher priority sooner
    digest = weekly_digest.using(priority=-20).enqueue("pro")
    welcome = send_welcome.enqueue(ada.pk)  # priority 10, from its @task
    urgent = weekly_digest.using(priority=90).enqueue("free")

    daemon = Proc(
        [sys.executable, "manage.py", "jobsd", "run"],
        env=manage_env(site.url, JOBSD_SLOTS="1", JOBSD_LOG_FORMAT="json"),
        cwd=NEWSLETTER,
    )
    try:
        daemon.wait_ready()
        results = _results([digest.id, welcome.id, urgent.id])
        daemon.send(signal.SIGTERM)
        assert daemon.wait() == 0, daemon.text()
    finally:
        daemon.kill()

    assert [str(r.status) for r in results] == ["SUCCESSFUL"] * 3, daemon.text()
    assert [r.return_value for r in results] == [1, {"sent_to": "ada@example.com"}, 0]
    started = sorted(results, key=lambda r: r.started_at)
    assert [r.id for r in started] == [urgent.id, welcome.id, digest.id]
    assert Subscriber.objects.get(pk=ada.pk).welcomed_at is not None
    assert "Traceback" not in daemon.text()


def test_manage_py_jobsd_passes_other_commands_to_jobsd(site: JobsdDB) -> None:
    from sitetasks import add

    enqueued = add.enqueue(1, 2)
    status = manage(site.url, "jobsd", "status", enqueued.id)

    assert status.returncode == 0, status.stderr
    assert enqueued.id in status.stdout and "queued" in status.stdout
