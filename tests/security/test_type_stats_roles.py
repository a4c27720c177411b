"""The per-type figures (migration 0029) under the least-privilege roles: an org reads
its own rows of jobsd.type_stats and none of every org's sums; the daemons' role, which
sees every org, reads both; roles made before the migration read them at once."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from support.retention import make_old_job

from jobsd.admin.roles import RoleNames, create_roles, drop_roles
from jobsd.store.migrate import migrate_sync

from .conftest import Roles, url_as

Conn = psycopg.Connection[Any]

ROWS = "SELECT org_id, sum(succeeded) FROM jobsd.type_stats WHERE period = 'hour' GROUP BY 1"
ALL_ORGS = "SELECT sum(succeeded) FROM jobsd.type_stats_all_orgs WHERE period = 'hour'"


def _count_two_orgs(conn: Conn) -> None:
    now = conn.execute("SELECT now()").fetchone()[0]
    for org in ("a", "b", "b"):
        make_old_job(conn, now, days=0.5, org_id=org)
    assert conn.execute("SELECT jobsd.archive_move(100, 0)").fetchone()[0] == 3


def _read(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as c:
        return sorted(c.execute(query).fetchall())


def test_an_org_reads_its_own_figures_and_not_every_orgs(conn: Conn, roles: Roles) -> None:
    _count_two_orgs(conn)
    for kind in ("enqueue", "api"):
        url = roles.url(kind, org="a")
        assert _read(url, ROWS) == [("a", 1)]
        assert _read(url, ALL_ORGS) == [(None,)]  # no row: every org's sums are not its
    worker = roles.url("worker")
    assert _read(worker, ROWS) == [("a", 1), ("b", 2)]
    assert _read(worker, ALL_ORGS) == [(3,)]


def test_roles_made_before_the_figures_read_them_after_the_upgrade(empty_db_url: str) -> None:
    migrate_sync(empty_db_url, up_to=27)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    create_roles(empty_db_url, prefix=prefix)
    names = RoleNames.for_prefix(prefix)
    try:
        migrate_sync(empty_db_url)
        with psycopg.connect(empty_db_url, autocommit=True) as conn:
            _count_two_orgs(conn)
        org_b = url_as(empty_db_url, names.api, options="-c jobsd.org_id=b")
        assert _read(org_b, ROWS) == [("b", 2)]
        assert _read(org_b, ALL_ORGS) == [(None,)]
        worker = url_as(empty_db_url, names.worker)
        assert _read(worker, ALL_ORGS) == [(3,)]
    finally:
        drop_roles(empty_db_url, prefix=prefix)
