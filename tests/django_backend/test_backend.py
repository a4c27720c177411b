"""The backend in a Django process: enqueue with the request's transaction, results
through Django's API, capability flags that match behaviour, and refusals."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobsd.testing import JobsdDB, JobsdWorker

from .conftest import count_jobs


def post(path: str, body: dict[str, Any]) -> Any:
    from django.test import Client

    return Client().post(path, json.dumps(body), content_type="application/json")


# -- the transaction ------------------------------------------------------------------


def test_a_view_whose_atomic_block_commits_leaves_one_job(site: JobsdDB) -> None:
    answer = post("/subscribe", {"email": "ada@example.com"})

    assert answer.status_code == 201, answer.content
    assert count_jobs(site.url, type="signups.tasks.send_welcome") == 1
    job = site.assert_enqueued("signups.tasks.send_welcome", count=1)
    assert job.id.hex == answer.json()["welcome"].replace("-", "")


def test_a_view_whose_atomic_block_rolls_back_leaves_no_job(site: JobsdDB) -> None:
    answer = post("/subscribe", {"email": "bob@example.com", "plan": "pro", "card": "declined"})

    assert answer.status_code == 402, answer.content
    assert count_jobs(site.url) == 0


def test_the_job_is_written_on_djangos_connection_in_its_transaction(site: JobsdDB) -> None:
    from django.db import connection, transaction
    from sitetasks import add

    with transaction.atomic():
        result = add.enqueue(1, 2)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM jobsd.jobs WHERE id = %s", [result.id])
            assert cursor.fetchone() == (1,)  # seen inside the transaction
        assert count_jobs(site.url) == 0  # and by no one else before the commit
    assert count_jobs(site.url) == 1


def test_outside_a_transaction_the_job_commits_at_once(site: JobsdDB) -> None:
    from sitetasks import add

    add.enqueue(1, 2)

    assert count_jobs(site.url, type="sitetasks.add") == 1


def test_a_refused_enqueue_leaves_the_callers_transaction_usable(site: JobsdDB) -> None:
    from django.db import transaction
    from django.test import override_settings
    from signups.models import Subscriber
    from sitetasks import add

    import jobsd

    tasks = {"default": {"BACKEND": "jobsd.contrib.django.JobsdBackend", "QUEUES": []}}
    with override_settings(TASKS=tasks), transaction.atomic():
        Subscriber.objects.create(email="kept@example.com")
        with pytest.raises(jobsd.UnknownQueue, match="nowhere"):
            add.using(queue_name="nowhere").enqueue(1, 2)
        Subscriber.objects.create(email="also-kept@example.com")
    assert Subscriber.objects.count() == 2
    assert count_jobs(site.url) == 0


def test_arguments_that_are_not_json_are_refused_naming_the_argument(site: JobsdDB) -> None:
    from django.db import transaction
    from signups.models import Subscriber
    from sitetasks import add

    from jobsd.errors import InvalidPayload

    with transaction.atomic():
        Subscriber.objects.create(email="kept@example.com")
        with pytest.raises(InvalidPayload, match=r"argument 'b' of task sitetasks\.add .*datetime"):
            add.enqueue(1, b=datetime.now(UTC))
        with pytest.raises(InvalidPayload, match=r"argument 0 of task sitetasks\.add .*set"):
            add.enqueue({1}, 2)
    assert Subscriber.objects.count() == 1
    assert count_jobs(site.url) == 0


def test_arguments_too_large_are_refused_before_any_sql(site: JobsdDB) -> None:
    from sitetasks import record

    from jobsd.errors import PayloadTooLarge

    with pytest.raises(PayloadTooLarge):
        record.enqueue("x" * 2_000_000)
    assert count_jobs(site.url) == 0


# -- results ----------------------------------------------------------------------------


def test_a_task_runs_to_a_result_read_through_djangos_api(worker: JobsdWorker) -> None:
    from sitetasks import add

    enqueued = add.enqueue(2, b=3)
    assert str(enqueued.status) == "READY"
    assert enqueued.args == [2] and enqueued.kwargs == {"b": 3}

    [ran] = worker.drain()

    assert ran.status == "succeeded"
    result = add.get_result(enqueued.id)
    assert str(result.status) == "SUCCESSFUL"
    assert result.return_value == 5
    assert result.attempts == 1 and result.worker_ids[0]
    assert result.enqueued_at <= result.started_at <= result.finished_at
    enqueued.refresh()
    assert str(enqueued.status) == "SUCCESSFUL"


def test_a_task_that_raises_fails_with_its_exception_and_traceback(worker: JobsdWorker) -> None:
    from sitetasks import fails

    enqueued = fails.enqueue("no such user")
    worker.drain()

    result = fails.get_result(enqueued.id)
    assert str(result.status) == "FAILED"
    [error] = result.errors
    assert error.exception_class is ValueError
    assert "no such user" in error.traceback and "Traceback" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018


def test_a_return_value_that_is_not_json_fails_the_task_saying_so(worker: JobsdWorker) -> None:
    from sitetasks import returns_a_set

    enqueued = returns_a_set.enqueue()
    worker.drain()

    [error] = returns_a_set.get_result(enqueued.id).errors
    assert error.exception_class is TypeError
    assert "sitetasks.returns_a_set returned a value that is not JSON" in error.traceback


def test_a_cancelled_task_is_failed_by_jobsd(site: JobsdDB) -> None:
    from sitetasks import add

    import jobsd
    from jobsd.contrib.django import JobCancelled

    enqueued = add.enqueue(1, 2)
    jobsd.SyncClient().cancel(enqueued.id)

    result = add.get_result(enqueued.id)
    assert str(result.status) == "FAILED"
    assert result.errors[0].exception_class is JobCancelled


def test_an_async_task_runs(worker: JobsdWorker) -> None:
    from sitetasks import shout

    enqueued = shout.enqueue("hello")
    worker.drain()

    assert shout.get_result(enqueued.id).return_value == "HELLO"


def test_a_task_taking_the_context_sees_its_attempt_and_id(worker: JobsdWorker) -> None:
    from sitetasks import which_attempt

    enqueued = which_attempt.enqueue()
    worker.drain()

    assert which_attempt.get_result(enqueued.id).return_value == {
        "attempt": 1,
        "id": enqueued.id,
    }


def test_get_result_of_no_task_is_does_not_exist(site: JobsdDB) -> None:
    from sitetasks import add

    import jobsd
    from jobsd.contrib.django.tasksapi import TaskResultDoesNotExist

    with pytest.raises(TaskResultDoesNotExist):
        add.get_result("not-a-uuid")
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result("0190a0a0-0000-7000-8000-000000000000")
    other = jobsd.SyncClient().enqueue("import_csv", {}, org_id="newsletter")
    with pytest.raises(TaskResultDoesNotExist, match="import_csv"):
        add.get_result(str(other.id))
    elsewhere = jobsd.SyncClient().enqueue("sitetasks.add", {}, org_id="another-org")
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(str(elsewhere.id))


# -- what the backend says it supports, and does -----------------------------------------


def test_the_capability_flags_are_all_set() -> None:
    import importlib

    from jobsd.contrib.django.tasksapi import PACKAGE

    backend = importlib.import_module(PACKAGE).default_task_backend
    assert (
        backend.supports_defer,
        backend.supports_async_task,
        backend.supports_get_result,
        backend.supports_priority,
    ) == (True, True, True, True)


def test_priority_is_honoured_higher_first(worker: JobsdWorker) -> None:
    from sitetasks import record

    for name, priority in (("low", -50), ("default", 0), ("high", 50), ("top", 100)):
        record.using(priority=priority).enqueue(name)

    ran = worker.drain()

    assert [r.job.payload["args"][0] for r in ran] == ["top", "high", "default", "low"]


def test_run_after_is_honoured(site: JobsdDB, worker: JobsdWorker) -> None:
    from sitetasks import record

    later = datetime.now(UTC) + timedelta(hours=1)
    enqueued = record.using(run_after=later).enqueue("later")

    assert worker.drain() == []
    job = site.assert_enqueued("sitetasks.record", status="scheduled")
    assert job.run_after == later
    assert str(record.get_result(enqueued.id).status) == "READY"
    [ran] = worker.drain(include_scheduled=True)
    assert ran.status == "succeeded"


# -- refusals at startup -------------------------------------------------------------


def _backend(**params: Any) -> Any:
    from jobsd.contrib.django import JobsdBackend

    return JobsdBackend("tests", {"BACKEND": "jobsd.contrib.django.JobsdBackend", **params})


def test_an_unknown_option_is_refused_naming_it(site: JobsdDB) -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match=r"'ORG'.*known: DATABASE, MAX_ATTEMPTS, ORG_ID"):
        _backend(OPTIONS={"ORG": "acme"})
    with pytest.raises(ImproperlyConfigured, match="'QUEUE'"):
        _backend(QUEUE=["default"])
    with pytest.raises(ImproperlyConfigured, match=r"MAX_ATTEMPTS.*at least 1, got 0"):
        _backend(OPTIONS={"MAX_ATTEMPTS": 0})


def test_max_attempts_is_the_handlers_runs(site: JobsdDB) -> None:
    from django.test import override_settings
    from sitetasks import add

    from jobsd.contrib.django.handlers import register_tasks
    from jobsd.registry import Registry

    backend = "jobsd.contrib.django.JobsdBackend"
    for given, runs in (({}, 1), ({"MAX_ATTEMPTS": 3}, 3)):
        tasks = {"default": {"BACKEND": backend, "OPTIONS": given}}
        with override_settings(TASKS=tasks):
            add.get_backend()  # the backend of these settings
            registry = Registry()
            register_tasks(registry)
            spec = registry.get("sitetasks.add")
            assert spec is not None and spec.max_attempts == runs


def test_a_database_that_is_not_postgresql_is_refused(site: JobsdDB) -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match=r"needs PostgreSQL: database 'lite'.*sqlite3"):
        _backend(OPTIONS={"DATABASE": "lite"})
    with pytest.raises(ImproperlyConfigured, match="'nowhere', which is not in DATABASES"):
        _backend(OPTIONS={"DATABASE": "nowhere"})


@pytest.mark.anyio
async def test_aenqueue_and_aget_result_work_from_async_code(site: JobsdDB) -> None:
    from sitetasks import add

    enqueued = await add.aenqueue(4, 5)
    result = await add.aget_result(enqueued.id)

    assert str(result.status) == "READY" and result.args == [4, 5]
    assert count_jobs(site.url, type="sitetasks.add") == 1


def test_an_async_task_taking_the_context_runs(worker: JobsdWorker) -> None:
    from sitetasks import which_attempt_async

    enqueued = which_attempt_async.enqueue()
    [ran] = worker.drain()

    assert ran.status == "succeeded", ran.job.error
    assert which_attempt_async.get_result(enqueued.id).return_value == {
        "attempt": 1,
        "id": enqueued.id,
    }


def test_a_task_of_another_backend_enqueued_on_jobsd_runs_there(worker: JobsdWorker) -> None:
    from sitetasks import elsewhere

    on_jobsd = elsewhere.using(backend="default")
    enqueued = on_jobsd.enqueue(21)
    [ran] = worker.drain()

    assert ran.status == "succeeded", ran.job.error
    assert on_jobsd.get_result(enqueued.id).return_value == 42


def _small_queue(site: JobsdDB) -> None:
    """A queue holding at most one open job, holding one."""
    import jobsd

    client = jobsd.SyncClient()
    try:
        import anyio

        async def create() -> None:
            async with jobsd.Client() as admin:
                await admin.create_queue("small", capacity=1)

        anyio.run(create)
        client.enqueue("filler", {}, org_id="newsletter", queue="small")
    finally:
        client.close()


def test_a_full_queue_inside_atomic_leaves_the_callers_transaction_usable(
    site: JobsdDB,
) -> None:
    from django.db import transaction
    from django.test import override_settings
    from signups.models import Subscriber
    from sitetasks import add

    import jobsd

    _small_queue(site)
    tasks = {"default": {"BACKEND": "jobsd.contrib.django.JobsdBackend", "QUEUES": []}}
    with override_settings(TASKS=tasks), transaction.atomic():
        Subscriber.objects.create(email="kept@example.com")
        with pytest.raises(jobsd.QueueFull):  # raised by the database: the savepoint
            add.using(queue_name="small").enqueue(1, 2)
        Subscriber.objects.create(email="also-kept@example.com")
    assert Subscriber.objects.count() == 2
    assert count_jobs(site.url, queue="small") == 1  # the filler only


def test_a_full_queue_in_autocommit_leaves_the_connection_usable(site: JobsdDB) -> None:
    from django.test import override_settings
    from signups.models import Subscriber
    from sitetasks import add

    import jobsd

    _small_queue(site)
    tasks = {"default": {"BACKEND": "jobsd.contrib.django.JobsdBackend", "QUEUES": []}}
    with override_settings(TASKS=tasks):
        with pytest.raises(jobsd.QueueFull):
            add.using(queue_name="small").enqueue(1, 2)
        Subscriber.objects.create(email="kept@example.com")
        add.enqueue(1, 2)
    assert Subscriber.objects.count() == 1
    assert count_jobs(site.url) == 2


def test_a_dead_persistent_connection_is_dropped_after_the_failed_request(
    site: JobsdDB, admin_url: str
) -> None:
    import psycopg
    from django.db import close_old_connections, connection
    from sitetasks import add

    from jobsd.errors import BackendUnavailable

    connection.settings_dict["CONN_MAX_AGE"] = 600  # kept across requests
    try:
        close_old_connections()  # a request starts
        add.enqueue(1, 2)
        pid = connection.connection.info.backend_pid
        close_old_connections()  # it ends: the connection is kept
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

        close_old_connections()  # the next request
        with pytest.raises(BackendUnavailable):
            add.enqueue(3, 4)
        close_old_connections()  # ends: the dead connection is dropped

        close_old_connections()  # the one after works
        add.enqueue(5, 6)
        assert connection.connection.info.backend_pid != pid
    finally:
        connection.settings_dict["CONN_MAX_AGE"] = 0
        connection.close()
    assert count_jobs(site.url) == 2


def test_priorities_given_as_whole_floats_keep_their_order(site: JobsdDB) -> None:
    from sitetasks import record

    record.using(priority=5.0).enqueue("five")

    assert site.assert_enqueued("sitetasks.record").priority == -5


def test_an_empty_org_id_is_refused(site: JobsdDB) -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match=r"ORG_ID.*non-empty"):
        _backend(OPTIONS={"ORG_ID": ""})


def test_the_system_check_names_a_backend_that_cannot_be_made(site: JobsdDB) -> None:
    from django.core import checks
    from django.test import override_settings

    backend = "jobsd.contrib.django.JobsdBackend"
    tasks = {"default": {"BACKEND": backend, "OPTIONS": {"DATABASE": "lite"}}}
    with override_settings(TASKS=tasks):
        errors = checks.run_checks()
    [error] = [e for e in errors if e.id == "jobsd.E001"]
    assert "needs PostgreSQL: database 'lite'" in error.msg


def test_the_schema_migration_skips_other_databases_and_refuses_sqlite(site: JobsdDB) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections
    from django.test import override_settings

    from jobsd.contrib.django.schema import apply_schema

    assert apply_schema(connections["lite"], up_to=27) == []  # no jobsd backend uses it
    backend = "jobsd.contrib.django.JobsdBackend"
    tasks = {"default": {"BACKEND": backend, "OPTIONS": {"DATABASE": "lite"}}}
    with (
        override_settings(TASKS=tasks),
        pytest.raises(ImproperlyConfigured, match="needs PostgreSQL: database 'lite'"),
    ):
        apply_schema(connections["lite"], up_to=27)
    assert apply_schema(connections["default"], up_to=27) == []  # up to date already
