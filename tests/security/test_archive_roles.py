"""The archive under the least-privilege roles: an org reads its own archived jobs only,
the daemons' role moves jobs, and an upgraded database's roles read the archive at once."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from support.retention import make_old_job

from jobsd import SyncClient
from jobsd.admin.roles import RoleNames, create_roles, drop_roles
from jobsd.errors import DuplicateJob
from jobsd.store.migrate import migrate_sync

from .conftest import Roles, url_as

Conn = psycopg.Connection[Any]


def _archive_two_orgs(conn: Conn) -> dict[str, uuid.UUID]:
    now = conn.execute("SELECT now()").fetchone()[0]
    jobs = {org: make_old_job(conn, now, days=3, org_id=org) for org in ("a", "b")}
    assert conn.execute("SELECT jobsd.archive_move(100, 0)").fetchone()[0] == 2
    return jobs


def _ids(url: str, query: str) -> set[uuid.UUID]:
    with psycopg.connect(url, autocommit=True) as c:
        return {r[0] for r in c.execute(query).fetchall()}


def test_an_org_reads_its_archived_jobs_only(conn: Conn, roles: Roles) -> None:
    jobs = _archive_two_orgs(conn)
    for kind in ("enqueue", "api"):
        url = roles.url(kind, org="a")
        assert _ids(url, "SELECT id FROM jobsd.all_jobs") == {jobs["a"]}
        assert _ids(url, "SELECT id FROM jobsd.jobs_archive") == {jobs["a"]}
        assert _ids(url, "SELECT job_id FROM jobsd.all_job_events") == {jobs["a"]}
        partition = conn.execute(
            "SELECT partition_name FROM jobsd.archive_months() WHERE contents <> '[]'"
        ).fetchone()[0]
        with (
            psycopg.connect(url, autocommit=True) as c,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            c.execute(f"SELECT id FROM jobsd.{partition}")
    # an id of another org's archived job is refused, and nothing about it is read
    with SyncClient(roles.url("enqueue", org="a")) as client:
        with pytest.raises(DuplicateJob):
            client.enqueue("t", org_id="a", job_id=jobs["b"])
        again = client.enqueue("t", org_id="a", job_id=jobs["a"])
    assert again.id == jobs["a"] and again.status == "succeeded"


def test_the_daemons_role_moves_jobs_and_sees_every_org(conn: Conn, roles: Roles) -> None:
    now = conn.execute("SELECT now()").fetchone()[0]
    for org in ("a", "b"):
        make_old_job(conn, now, days=1, org_id=org)
    with psycopg.connect(roles.url("worker"), autocommit=True) as worker:
        assert worker.execute("SELECT jobsd.archive_move(100, 0)").fetchone()[0] == 2
        assert worker.execute("SELECT count(*) FROM jobsd.all_jobs").fetchone()[0] == 2
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker.execute("SELECT jobsd.archive_drop(now(), 100)")


def test_roles_made_before_the_archive_read_it_after_the_upgrade(empty_db_url: str) -> None:
    migrate_sync(empty_db_url, up_to=26)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    create_roles(empty_db_url, prefix=prefix)
    names = RoleNames.for_prefix(prefix)
    try:
        migrate_sync(empty_db_url)
        with psycopg.connect(empty_db_url, autocommit=True) as conn:
            jobs = _archive_two_orgs(conn)
        url = url_as(empty_db_url, names.enqueue, options="-c jobsd.org_id=b")
        assert _ids(url, "SELECT id FROM jobsd.all_jobs") == {jobs["b"]}
        worker = url_as(empty_db_url, names.worker)
        assert _ids(worker, "SELECT id FROM jobsd.all_jobs") == set(jobs.values())
        with psycopg.connect(worker, autocommit=True) as c:
            assert c.execute("SELECT jobsd.archive_move(10, 0)").fetchone()[0] == 0
    finally:
        drop_roles(empty_db_url, prefix=prefix)
