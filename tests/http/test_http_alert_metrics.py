"""The metrics alerting rules read: a stuck queue's oldest wait, errors by type and
cause, run times of failed runs, the recovery_required backlog."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest
from apikit import bearer, http_settings, running_api, running_daemon, settings_for, wait_until
from psycopg.conninfo import make_conninfo
from support.jobs import make_job

import jobsd
from jobsd.admin.roles import RoleNames
from jobsd.recovery import AMBIGUOUS
from jobsd.registry import Registry
from jobsd.store import api as store_api

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Map (sample name, sorted labels) to value."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def by_label(now: Samples, name: str, label: str) -> dict[str, float]:
    """Return the samples of ``name`` by the value of ``label``."""
    return {dict(labels)[label]: v for (n, labels), v in now.items() if n == name}


def declare_queue(db_url: str, name: str, *, paused: bool = False) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobsd.queues (name, paused_at) VALUES (%s, CASE WHEN %s THEN now() END)",
            (name, paused),
        )


async def scrape(api: Any) -> Samples:
    r = await api.client.get("/metrics")
    assert r.status_code == 200, r.text
    return samples(r.text)


def ages(now: Samples) -> dict[str, float]:
    return by_label(now, "jobsd_queue_oldest_age_seconds", "queue")


async def test_a_stuck_queue_shows_its_oldest_wait_growing_then_zero_once_run(
    db_url: str, token_a: str
) -> None:
    declare_queue(db_url, "idle")
    declare_queue(db_url, "held", paused=True)
    settings = settings_for(db_url)
    async with running_api(settings) as api:  # no daemon: nothing takes the jobs
        first = await scrape(api)
        assert ages(first) == {"default": 0.0, "held": 0.0, "idle": 0.0}
        ids = []
        for _ in range(3):
            r = await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token_a))
            ids.append(r.json()["id"])
        start = ages(await scrape(api))["default"]

        async def grown() -> float | None:
            age = ages(await scrape(api))["default"]
            return age if age > start else None

        later = await wait_until(grown, what="the oldest wait to grow on the database's clock")
        assert later > 0
        # a job due for an hour: the figure says so at once
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE jobsd.jobs SET created_at = now() - interval '1 hour', "
                "run_after = now() - interval '1 hour' WHERE id = %s",
                (ids[0],),
            )
        now = await scrape(api)
        assert 3600 <= ages(now)["default"] < 3600 + 60
        assert ages(now)["idle"] == 0.0
        assert by_label(now, "jobsd_queue_paused", "queue") == {
            "default": 0.0,
            "held": 1.0,
            "idle": 0.0,
        }
        registry = Registry()

        @jobsd.handler("t", registry=registry)
        async def t(ctx: jobsd.JobContext) -> None:
            pass

        async with running_daemon(settings, registry):
            for job_id in ids:
                r = await api.client.get(f"/jobs/{job_id}?wait=10", headers=bearer(token_a))
                assert r.json()["status"] == "succeeded"
        assert ages(await scrape(api)) == {"default": 0.0, "held": 0.0, "idle": 0.0}


async def test_the_oldest_wait_on_a_pinned_clock(db_url: str) -> None:
    declare_queue(db_url, "mail")
    declare_queue(db_url, "idle", paused=True)
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    with psycopg.connect(db_url, autocommit=True) as conn:
        make_job(conn, queue="mail", created_at=t0, run_after=t0)
        # created later, due since its creation (its run_after was already past)
        make_job(conn, queue="default", created_at=t0 + timedelta(minutes=1), run_after=t0)
        # due only later: not waiting yet
        make_job(conn, queue="default", created_at=t0, run_after=t0 + timedelta(hours=1))
        # started or ended jobs wait for nothing
        make_job(conn, queue="idle", status="running", created_at=t0, run_after=t0)
        make_job(conn, queue="idle", status="succeeded", created_at=t0, run_after=t0)

    async def read(now: datetime) -> dict[str, tuple[bool, float]]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            rows = await store_api.queue_oldest_age(conn, timeout_s=5, now=now)
        return {r.queue: (r.paused, r.age_s) for r in rows}

    assert await read(t0 + timedelta(seconds=90)) == {
        "default": (False, 30.0),
        "idle": (True, 0.0),
        "mail": (False, 90.0),
    }
    assert await read(t0 + timedelta(hours=2)) == {
        "default": (False, 7140.0),  # the older of the two, both due now
        "idle": (True, 0.0),
        "mail": (False, 7200.0),
    }
    # a clock before the jobs: none is due
    assert await read(t0 - timedelta(seconds=1)) == {
        "default": (False, 0.0),
        "idle": (True, 0.0),
        "mail": (False, 0.0),
    }


async def test_an_org_restricted_api_role_sees_every_orgs_oldest_wait(
    db_url: str, roles: RoleNames
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for org in ("acme", "globex"):
            make_job(
                conn,
                org_id=org,
                status="recovery_required",
                created_at=datetime.now(UTC) - timedelta(hours=1),
            )
        make_job(
            conn,
            org_id="globex",
            created_at=datetime.now(UTC) - timedelta(hours=1),
            run_after=datetime.now(UTC) - timedelta(hours=1),
        )
    api_url = make_conninfo(db_url, user=roles.api)
    async with running_api(settings_for(api_url)) as api:
        now = await scrape(api)
    assert ages(now)["default"] >= 3600
    depth = by_label(now, "jobsd_queue_depth", "status")
    assert depth == {"queued": 1, "scheduled": 0, "running": 0, "recovery_required": 2}


async def test_the_depth_counts_the_recovery_required_backlog(db_url: str) -> None:
    registry = Registry()

    @jobsd.handler(
        "charge",
        registry=registry,
        delivery="at_most_once",
        recover=lambda job: AMBIGUOUS,
        timeout=0.05,
    )
    async def charge(ctx: jobsd.JobContext) -> None:
        await anyio.sleep(10)  # the card terminal hangs: the timeout leaves it unknown

    settings = settings_for(db_url)
    async with (
        running_daemon(settings, registry) as daemon,
        running_api(settings, daemon=daemon) as api,
    ):
        async with jobsd.Client(db_url) as client:
            job = await client.enqueue("charge", org_id="acme")
        await wait_until(
            lambda: _status_is(db_url, job.id, "recovery_required"), what="recovery_required"
        )
        now = await scrape(api)
    depth = {
        dict(labels)["status"]: v
        for (name, labels), v in now.items()
        if name == "jobsd_queue_depth" and dict(labels)["queue"] == "default"
    }
    assert depth == {"queued": 0, "scheduled": 0, "running": 0, "recovery_required": 1}
    errors = by_label(now, "jobsd_job_errors_total", "cause")
    assert errors == {"timeout": 1}


async def _status_is(db_url: str, job_id: object, status: str) -> bool:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM jobsd.jobs WHERE id = %s", (job_id,)).fetchone()
    return row is not None and row[0] == status


async def test_errors_count_each_failed_attempt_by_type_and_cause(db_url: str) -> None:
    registry = Registry()

    @jobsd.handler("flaky", registry=registry, retry=jobsd.RetryPolicy(3, backoff=0))
    async def flaky(ctx: jobsd.JobContext) -> None:
        raise ConnectionError(f"attempt {ctx.attempt}: the mail server hung up")

    @jobsd.handler("slow", registry=registry, timeout=0.05)
    async def slow(ctx: jobsd.JobContext) -> None:
        await anyio.sleep(10)

    @jobsd.handler("fine", registry=registry)
    async def fine(ctx: jobsd.JobContext) -> None:
        pass

    settings = settings_for(db_url)
    async with (
        running_daemon(settings, registry) as daemon,
        running_api(settings, daemon=daemon) as api,
    ):
        async with jobsd.Client(db_url) as client:
            ids = [
                (await client.enqueue(type_, org_id="acme")).id
                for type_ in ("flaky", "slow", "fine")
            ]
        for job_id in ids:
            await wait_until(
                lambda job_id=job_id: _ended(db_url, job_id), what=f"job {job_id} to end"
            )

        async def written() -> Samples | None:
            now = await scrape(api)
            finished = by_label(now, "jobsd_jobs_finished_total", "type")
            return now if len(finished) == 3 else None

        now = await wait_until(written, what="every outcome in /metrics")
    errors = {
        (dict(labels)["type"], dict(labels)["cause"]): v
        for (name, labels), v in now.items()
        if name == "jobsd_job_errors_total"
    }
    assert errors == {("flaky", "handler error"): 3, ("slow", "timeout"): 1}
    finished = {
        (dict(labels)["type"], dict(labels)["status"]): v
        for (name, labels), v in now.items()
        if name == "jobsd_jobs_finished_total"
    }
    assert finished == {
        ("flaky", "scheduled"): 2,
        ("flaky", "failed"): 1,
        ("slow", "failed"): 1,
        ("fine", "succeeded"): 1,
    }
    # the run-time histogram counts failed runs too, each type apart
    runs = by_label(now, "jobsd_job_run_seconds_count", "type")
    assert runs == {"flaky": 3, "slow": 1, "fine": 1}
    assert now[("jobsd_job_run_seconds_sum", (("type", "slow"),))] >= 0.05


async def _ended(db_url: str, job_id: object) -> bool:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM jobsd.jobs WHERE id = %s", (job_id,)).fetchone()
    return row is not None and row[0] in ("succeeded", "failed")


async def test_a_database_down_leaves_the_oldest_wait_out_of_a_scrape_that_answers(
    db_url: str,
) -> None:
    # port 1 refuses at once: the pools never connect
    down = make_conninfo(db_url, host="127.0.0.1", port="1")
    async with running_api(settings_for(down), http_settings(ready_timeout=0.5)) as api:
        r = await api.client.get("/metrics")
    assert r.status_code == 200
    now = samples(r.text)
    assert now[("jobsd_database_up", ())] == 0
    assert now[("jobsd_api_listen_connected", ())] == 0  # started: the reads were tried
    for family in ("jobsd_queue_oldest_age_seconds", "jobsd_queue_paused", "jobsd_queue_depth"):
        assert f"# TYPE {family} " not in r.text
