"""What Django's tasks API costs over jobsd's own enqueue: single enqueues per second
through ``task.enqueue()`` (jobsd.contrib.django), against ``jobsd.enqueue_sync`` on the
same Django connection and ``SyncClient.enqueue`` on jobsd's own pool.

    uv run python bench/django_enqueue.py [--jobs 3000] [--rounds 3] [--database-url URL]

Each case enqueues N jobs one call at a time, each committed on its own (autocommit;
``atomic`` wraps every call in its own ``transaction.atomic()`` block, as a view does).
Rounds are interleaved and the best of each case kept. Without ``--database-url`` a
throwaway embedded Postgres is used. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from jobsd.dev.database import dev_database
from jobsd.store.migrate import migrate_sync


def _configure(url: str) -> None:
    import django
    from django.conf import settings
    from psycopg.conninfo import conninfo_to_dict

    params: dict[str, Any] = dict(conninfo_to_dict(url))
    settings.configure(
        INSTALLED_APPS=["jobsd.contrib.django"],
        USE_TZ=True,
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": params.pop("dbname"),
                "USER": params.pop("user", ""),
                "PASSWORD": params.pop("password", ""),
                "HOST": params.pop("host", ""),
                "PORT": params.pop("port", ""),
                "OPTIONS": params,
            }
        },
        TASKS={"default": {"BACKEND": "jobsd.contrib.django.JobsdBackend"}},
    )
    django.setup()


def noop(n: int) -> None:
    """The task enqueued (never run here)."""


def _cases(jobs: int) -> dict[str, Callable[[], None]]:
    from django.db import connection, transaction

    import jobsd
    from jobsd.contrib.django.tasksapi import PACKAGE

    task = __import__(PACKAGE, fromlist=["task"]).task(noop)
    client = jobsd.SyncClient()

    def django_task() -> None:
        for i in range(jobs):
            task.enqueue(i)

    def django_task_atomic() -> None:
        for i in range(jobs):
            with transaction.atomic():
                task.enqueue(i)

    def enqueue_sync_same_connection() -> None:
        connection.ensure_connection()
        for i in range(jobs):
            jobsd.enqueue_sync("noop", {"n": i}, org_id="bench", conn=connection.connection)

    def sync_client() -> None:
        for i in range(jobs):
            client.enqueue("noop", {"n": i}, org_id="bench")

    return {
        "`task.enqueue()` (Django, autocommit)": django_task,
        "`task.enqueue()` in `atomic()`": django_task_atomic,
        "`jobsd.enqueue_sync(conn=Django's)`": enqueue_sync_same_connection,
        "`SyncClient.enqueue` (jobsd's pool)": sync_client,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    with dev_database(args.database_url) as (url, _):
        migrate_sync(url)
        import os

        os.environ["JOBSD_DATABASE_URL"] = url
        _configure(url)
        cases = _cases(args.jobs)
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, case in cases.items():
                started = time.perf_counter()
                case()
                rate = args.jobs / (time.perf_counter() - started)
                best[name] = max(rate, best.get(name, 0.0))
        from django.db import connections

        connections.close_all()
        import jobsd

        jobsd.close()
    base = best["`SyncClient.enqueue` (jobsd's pool)"]
    head = f"single enqueue ({args.jobs} per case, best of {args.rounds})"
    print(f"| {head} | jobs/s | µs per job | against SyncClient |")
    print("|---|---|---|---|")
    for name, rate in best.items():
        print(f"| {name} | {rate:,.0f} | {1e6 / rate:.0f} | {rate / base:.2f} |")


if __name__ == "__main__":
    main()
