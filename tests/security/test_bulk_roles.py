"""The bulk actions under the least-privilege roles: the API's and the application's roles
act on their org's jobs only, an org reads its own audit rows only, and roles made before
migration 0031 may run the bulk actions after the upgrade."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from support.jobs import make_jobs

from jobsd.admin.roles import RoleNames, create_roles, drop_roles
from jobsd.errors import DatabaseError
from jobsd.ops import Caller
from jobsd.ops.bulk import cancel_many_sync, retry_many_sync
from jobsd.store.migrate import migrate_sync

from .conftest import Roles, url_as

Conn = psycopg.Connection[Any]
CLAIM = {"attempts": 1, "worker_id": "w1"}


def test_the_api_role_acts_on_its_orgs_jobs_and_reads_its_own_audit(
    conn: Conn, roles: Roles
) -> None:
    mine = make_jobs(conn, 3, status="failed", org_id="a", claim=CLAIM)
    make_jobs(conn, 2, status="failed", org_id="b", claim=CLAIM)
    with psycopg.connect(roles.url("api"), autocommit=True) as api:
        out = retry_many_sync(api, Caller.for_org("a", "api"))
        assert (out.done, out.remaining) == (3, 0)
        assert cancel_many_sync(api, Caller.for_org("a", "api")).done == 3
    made = conn.execute(
        "SELECT count(*) FROM jobsd.jobs WHERE retry_of = ANY(%s)", (mine,)
    ).fetchone()
    assert made == (3,)
    assert conn.execute("SELECT count(*) FROM jobsd.jobs WHERE org_id = 'b'").fetchone() == (2,)
    # the audit: an org reads its own rows; no role writes it directly
    with psycopg.connect(roles.url("read", org="a"), autocommit=True) as read:
        assert read.execute("SELECT count(*) FROM jobsd.bulk_actions").fetchone() == (2,)
    with psycopg.connect(roles.url("read", org="b"), autocommit=True) as read:
        assert read.execute("SELECT count(*) FROM jobsd.bulk_actions").fetchone() == (0,)
    with (
        psycopg.connect(roles.url("api", org="a"), autocommit=True) as api,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        api.execute(
            "INSERT INTO jobsd.bulk_actions (actor, action, filter) VALUES ('x', 'retry', '{}')"
        )


def test_roles_made_before_the_bulk_actions_may_run_them_after_the_upgrade(
    empty_db_url: str,
) -> None:
    migrate_sync(empty_db_url, up_to=27)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    create_roles(empty_db_url, prefix=prefix)
    names = RoleNames.for_prefix(prefix)
    try:
        migrate_sync(empty_db_url)
        with psycopg.connect(empty_db_url, autocommit=True) as conn:
            make_jobs(conn, 2, status="failed", org_id="a", claim=CLAIM)
        for role in (names.api, names.enqueue):
            with psycopg.connect(url_as(empty_db_url, role), autocommit=True) as c:
                dry = retry_many_sync(c, Caller.for_org("a", "app"), dry_run=True)
                assert dry.matched == 2
        # the read role may not act on jobs
        with (
            psycopg.connect(url_as(empty_db_url, names.read), autocommit=True) as c,
            pytest.raises(DatabaseError, match="permission denied"),
        ):
            retry_many_sync(c, Caller.for_org("a", "app"), dry_run=True)
    finally:
        drop_roles(empty_db_url, prefix=prefix)
