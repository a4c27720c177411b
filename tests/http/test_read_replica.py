"""The reads that may lag on a streaming replica (JOBSD_READ_DATABASE_URL), in-process.

A primary and an asynchronous standby (``support.replication``) for the module. That a
read came from the standby is shown on the server's side: its replay is paused
(``pg_wal_replay_pause``), the job changes on the primary, and the read still shows
the old state, with ``X-Jobsd-Replica-Lag``; a long-poll sees the new one.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import psycopg
import pytest
from apikit import bearer, make_token, running_api, settings_for, ui_login
from psycopg.conninfo import make_conninfo
from support.replication import ReplicatedPair
from support.waiting import poll, wait_until

from jobsd.admin.roles import RoleNames, create_roles, drop_roles
from jobsd.errors import ConfigError
from jobsd.http.routes import REPLICA_LAG_HEADER

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicatedPair]:
    """A primary and its streaming standby (asynchronous), migrated."""
    made = ReplicatedPair(synchronous=False, dbname="jobsd_replica")
    try:
        yield made
    finally:
        made.cleanup()


def _urls(pair: ReplicatedPair) -> tuple[str, str]:
    assert pair.standby is not None
    return pair.primary.url(pair.dbname), pair.standby.url(pair.dbname)


def _scalar(url: str, query: str) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return row[0] if row else None


def _replayed(pair: ReplicatedPair) -> None:
    """Wait until the standby has replayed everything the primary wrote so far."""
    primary, standby = _urls(pair)
    target = _scalar(primary, "SELECT pg_current_wal_lsn()::text")
    query = f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"
    poll(lambda: _scalar(standby, query), what=f"the standby replaying up to {target}")


def _received(pair: ReplicatedPair) -> None:
    """Wait until the standby has received (not replayed) what the primary wrote."""
    primary, standby = _urls(pair)
    target = _scalar(primary, "SELECT pg_current_wal_lsn()::text")
    query = f"SELECT pg_last_wal_receive_lsn() >= '{target}'::pg_lsn"
    poll(lambda: _scalar(standby, query), what=f"the standby receiving up to {target}")


class _Paused:
    """Replay paused on the standby for the block (WAL still received), resumed after."""

    def __init__(self, pair: ReplicatedPair) -> None:
        self.standby = _urls(pair)[1]

    def __enter__(self) -> None:
        _scalar(self.standby, "SELECT pg_wal_replay_pause()")
        poll(
            lambda: _scalar(self.standby, "SELECT pg_get_wal_replay_pause_state() = 'paused'"),
            what="replay paused",
        )

    def __exit__(self, *exc: object) -> None:
        _scalar(self.standby, "SELECT pg_wal_replay_resume()")


def _settings(pair: ReplicatedPair, *, read_url: str | None = None) -> Any:
    primary, standby = _urls(pair)
    return settings_for(primary, read_database_url=read_url or standby)


async def test_a_read_without_wait_is_the_replicas_a_long_poll_the_primarys(
    pair: ReplicatedPair,
) -> None:
    primary, _ = _urls(pair)
    token = make_token(primary, "acme")
    async with running_api(_settings(pair)) as api:
        made = await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token))
        assert made.status_code == 202, made.text
        job_id = made.json()["id"]
        _replayed(pair)
        with _Paused(pair):
            cancelled = await api.client.post(f"/jobs/{job_id}/cancel", headers=bearer(token))
            assert cancelled.json()["status"] == "cancelled"  # a write: on the primary
            _received(pair)

            read = await api.client.get(f"/jobs/{job_id}", headers=bearer(token))
            assert read.status_code == 200, read.text
            assert read.json()["status"] == "queued"  # the standby's state: older
            assert float(read.headers[REPLICA_LAG_HEADER]) > 0

            listed = await api.client.get("/jobs", headers=bearer(token))
            assert [j["status"] for j in listed.json()["jobs"]] == ["queued"]
            assert REPLICA_LAG_HEADER in listed.headers

            waited = await api.client.get(f"/jobs/{job_id}?wait=1", headers=bearer(token))
            assert waited.json()["status"] == "cancelled"  # the primary's: current
            assert REPLICA_LAG_HEADER not in waited.headers

        async def caught_up() -> bool:
            read = await api.client.get(f"/jobs/{job_id}", headers=bearer(token))
            return read.json()["status"] == "cancelled" and REPLICA_LAG_HEADER in read.headers

        await wait_until(caught_up, what="the replica replaying the cancel")

        async def no_delay() -> bool:  # replayed all it received: 0, however old the commit
            read = await api.client.get(f"/jobs/{job_id}", headers=bearer(token))
            return float(read.headers[REPLICA_LAG_HEADER]) == 0

        await wait_until(no_delay, what="a replica delay of 0")


async def test_a_job_the_replica_has_not_replayed_is_read_on_the_primary(
    pair: ReplicatedPair,
) -> None:
    primary, _ = _urls(pair)
    token = make_token(primary, "acme")
    other = make_token(primary, "globex")
    _replayed(pair)
    async with running_api(_settings(pair)) as api:
        with _Paused(pair):
            made = await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token))
            job_id = made.json()["id"]
            read = await api.client.get(f"/jobs/{job_id}", headers=bearer(token))
            assert read.status_code == 200, read.text  # never a 404 for one's own new job
            assert read.json()["status"] == "queued"
            assert REPLICA_LAG_HEADER not in read.headers  # answered by the primary
            # another org: not found on the replica, nor on the primary
            theirs = await api.client.get(f"/jobs/{job_id}", headers=bearer(other))
            assert theirs.status_code == 404
            missing = await api.client.get(f"/jobs/{uuid.uuid4()}", headers=bearer(token))
            assert missing.status_code == 404


async def test_the_dashboard_says_its_pages_come_from_a_replica(pair: ReplicatedPair) -> None:
    primary, _ = _urls(pair)
    token = make_token(primary, "acme")
    async with running_api(_settings(pair)) as api:
        made = await api.client.post("/jobs", json={"type": "shown"}, headers=bearer(token))
        job_id = made.json()["id"]
        _replayed(pair)
        await ui_login(api.client, token)
        notice = re.compile(r'class="replica-notice"[^>]*>read from a replica, \d+ (ms|s) behind<')
        for page in ("/ui", "/ui/jobs", f"/ui/jobs/{job_id}"):
            answer = await api.client.get(page)
            assert answer.status_code == 200, answer.text
            assert notice.search(answer.text), (page, answer.text[:2000])
        live = await api.client.get(f"/ui/jobs/{job_id}/live")
        assert live.json()["status"] == "queued" and REPLICA_LAG_HEADER in live.headers

        # the page an action leads to shows the change: read on the primary
        csrf = await ui_login(api.client, token)
        with _Paused(pair):
            done = await api.client.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf})
            assert done.status_code == 303, done.text
            after = await api.client.get(done.headers["location"])
            assert 'id="job-status">cancelled<' in after.text
            assert "replica-notice" not in after.text
            lagging = await api.client.get(f"/ui/jobs/{job_id}")  # the replica's, paused
            assert 'id="job-status">queued<' in lagging.text and notice.search(lagging.text)

    # without a replica: no notice
    async with running_api(settings_for(primary)) as api:
        await ui_login(api.client, token)
        assert "replica-notice" not in (await api.client.get("/ui/jobs")).text


async def test_the_replica_reads_under_the_apis_role_and_its_checks(
    pair: ReplicatedPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    primary, standby = _urls(pair)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    create_roles(primary, prefix=prefix)
    try:
        names = RoleNames.for_prefix(prefix)
        _replayed(pair)  # the roles exist on the standby too
        token, other = make_token(primary, "acme"), make_token(primary, "globex")
        api_url = make_conninfo(primary, user=names.api)
        read_url = make_conninfo(standby, user=names.api)
        settings = settings_for(api_url, read_database_url=read_url)
        async with running_api(settings) as api:
            made = await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token))
            job_id = made.json()["id"]
            _replayed(pair)
            read = await api.client.get(f"/jobs/{job_id}", headers=bearer(token))
            assert read.status_code == 200 and REPLICA_LAG_HEADER in read.headers
            theirs = await api.client.get("/jobs", headers=bearer(other))
            assert theirs.json()["jobs"] == [] and REPLICA_LAG_HEADER in theirs.headers

        # a replica URL whose role bypasses row-level security is refused, as the primary's
        monkeypatch.setattr("jobsd.http.backend.allow_insecure", lambda: False)
        refused = settings_for(api_url, read_database_url=standby)  # a superuser
        with pytest.raises(ConfigError, match="JOBSD_API_READ_DATABASE_URL") as raised:
            async with running_api(refused):
                pytest.fail("the API started")
        assert "bypasses row-level security" in str(raised.value)
    finally:
        drop_roles(primary, prefix=prefix)


async def test_a_stopped_replica_the_same_request_is_answered_by_the_primary(
    pair: ReplicatedPair, caplog: pytest.LogCaptureFixture
) -> None:
    # last of the module: it stops the standby (and starts it again)
    primary, _ = _urls(pair)
    assert pair.standby is not None
    token = make_token(primary, "acme")
    caplog.set_level(logging.INFO, logger="jobsd.store.replica")
    async with running_api(_settings(pair)) as api:
        made = await api.client.post("/jobs", json={"type": "t"}, headers=bearer(token))
        job_id = made.json()["id"]
        _replayed(pair)
        read = await api.client.get(f"/jobs/{job_id}", headers=bearer(token))
        assert read.status_code == 200 and REPLICA_LAG_HEADER in read.headers

        pair.standby.stop()
        try:
            for _ in range(3):  # the first after the stop, and those while the gate is shut
                with anyio.fail_after(3):  # no full pool timeout per request
                    read = await api.client.get(f"/jobs/{job_id}", headers=bearer(token))
                assert read.status_code == 200, read.text
                assert read.json()["id"] == job_id
                assert REPLICA_LAG_HEADER not in read.headers
                with anyio.fail_after(3):
                    listed = await api.client.get("/jobs", headers=bearer(token))
                assert listed.status_code == 200 and REPLICA_LAG_HEADER not in listed.headers
            downs = [r for r in caplog.records if r.getMessage() == "read_replica.unavailable"]
            assert len(downs) == 1, caplog.messages  # once per episode
        finally:
            pair.standby.start()

        api.backend.replica_gate.retry_after_s = 0.2  # try the replica again soon

        async def back() -> bool:
            read = await api.client.get(f"/jobs/{job_id}", headers=bearer(token))
            return read.status_code == 200 and REPLICA_LAG_HEADER in read.headers

        await wait_until(back, what="reads served by the replica again", timeout_s=30)
        assert "read_replica.back" in caplog.messages
