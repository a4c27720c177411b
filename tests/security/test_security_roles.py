"""The least-privilege roles: exactly the grants each needs, and clear failures with less."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import click
import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql
from support.daemon import running_daemon

import jobsd
from jobsd.admin.roles import (
    ROLE_KINDS,
    RoleNames,
    check_sees_all_orgs,
    create_roles,
    drop_roles,
)
from jobsd.cli import main as jobsd_main
from jobsd.errors import ConfigError, DatabaseError, JobNotFound
from jobsd.jobspec import JobSpec
from jobsd.registry import Registry
from jobsd.settings import Settings
from jobsd.store import queries
from jobsd.store.enqueue import BULK_COPY_MIN_JOBS
from jobsd.store.enqueue_batch import BATCH_COPY_MIN_JOBS
from jobsd.store.migrate import migrate_sync, migration_status_sync

from .conftest import FAST, Roles, wait_until

PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
TABLES = ("queues", "jobs", "job_events", "schema_migrations", "api_tokens")


def _privileges(url: str, role: str) -> set[str]:
    """Return every table privilege ``role`` holds in schema jobsd, as 'table:PRIV'."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname, p.priv FROM pg_class AS c "
            "CROSS JOIN unnest(%s::text[]) AS p(priv) "
            "WHERE c.relnamespace = 'jobsd'::regnamespace AND c.relkind = 'r' "
            "  AND has_table_privilege(%s, c.oid, p.priv)",
            (list(PRIVILEGES), role),
        ).fetchall()
    return {f"{table}:{priv}" for table, priv in rows}


def _routines(url: str, role: str) -> set[str]:
    """Return the jobsd functions ``role`` may execute that PUBLIC may not."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT p.proname FROM pg_proc AS p "
            "WHERE p.pronamespace = 'jobsd'::regnamespace "
            "  AND has_function_privilege(%s, p.oid, 'EXECUTE') "
            "  AND p.proacl IS NOT NULL AND NOT EXISTS ("
            "    SELECT 1 FROM aclexplode(p.proacl) AS a "
            "    WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')",
            (role,),
        ).fetchall()
    return {r[0] for r in rows}


def _tables(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname FROM pg_class "
            "WHERE relnamespace = 'jobsd'::regnamespace AND relkind = 'r'"
        ).fetchall()
    return {r[0] for r in rows}


def test_each_role_gets_exactly_what_it_needs(roles: Roles) -> None:
    names, url = roles.names, roles.db_url
    tables = _tables(url)
    assert {"queues", "jobs", "job_events", "schema_migrations"} <= tables
    # every role may read its own row of role_orgs (granted to PUBLIC, row-level security)
    own_org = {"role_orgs:SELECT"}

    assert _privileges(url, names.read) == {f"{t}:SELECT" for t in tables}
    tenant_app = {
        "jobs:SELECT",
        "jobs:INSERT",
        "job_events:SELECT",  # no INSERT: history is written by the database's triggers
        "job_dependencies:SELECT",
        "job_dependencies:INSERT",
        "queues:SELECT",
        "schema_migrations:SELECT",
        # 0029: the per-type figures, row-level security as jobs (every org's sums: none)
        "type_stats:SELECT",
        "type_stats_all_orgs:SELECT",
        *own_org,
    }
    assert _privileges(url, names.enqueue) == tenant_app
    assert _privileges(url, names.api) == tenant_app
    assert _privileges(url, names.admin) == {"queues:SELECT", "schema_migrations:SELECT", *own_org}
    assert _privileges(url, names.worker) == {
        "jobs:SELECT",
        "jobs:INSERT",  # the scheduler of periodic jobs enqueues
        "jobs:UPDATE",
        "job_events:INSERT",
        "queues:SELECT",
        "schema_migrations:SELECT",
        "workers:SELECT",
        "workers:INSERT",
        "workers:UPDATE",
        "workers:DELETE",
        "concurrency_keys:SELECT",
        "concurrency_keys:UPDATE",
        "schedules:SELECT",
        "schedules:INSERT",
        "schedules:UPDATE",
        "schedule_ticks:SELECT",
        "schedule_ticks:INSERT",
        "schedule_ticks:UPDATE",
        "schedule_ticks:DELETE",
        *own_org,
        # each daemon records its types' rules (a retry reads their delivery)
        "job_types:SELECT",
        "job_types:INSERT",
        "job_types:UPDATE",
        # 0015: a daemon claims a failed job's on_fail hook by inserting its row
        "fail_hooks:SELECT",
        "fail_hooks:INSERT",
        # 0029: the per-type figures (the dashboard, as the role that sees every org)
        "type_stats:SELECT",
        "type_stats_all_orgs:SELECT",
    }
    # functions PUBLIC may not run: queue administration for the admin role (and the
    # API's role, a member of it), never queue_drop (the owner's); the token lookup
    # for the API; queue listing for the read role; the triggers' functions for nobody.
    # unhandled_jobs (every org's queued types, migration 0019): /health, queue listing
    administration = {
        "unhandled_jobs",
        "queue_info",
        "queue_create",
        "queue_set_limits",
        "queue_set_org_limits",
        "queue_pause",
        "queue_resume",
    }
    assert _routines(url, names.admin) == administration | {"schedule_info"}
    api_reads = {
        "api_token_lookup",
        "done_notify_key",
        "ui_session_start",
        "ui_session_lookup",
        "ui_session_end",
    }
    # an enqueue that gives an id asks whether an archived job holds it (0027)
    archived_id = {"archived_job_org"}
    # who may retry one job may act on every job of a filter (0031)
    retries = {"job_retry", "bulk_retry", "bulk_cancel", "bulk_resolve"}
    assert (
        _routines(url, names.api)
        == administration | {"schedule_info"} | retries | api_reads | archived_id
    )
    assert _routines(url, names.enqueue) == api_reads | retries | archived_id
    listing = {"queue_info", "unhandled_jobs", "schedule_info"}
    assert _routines(url, names.read) == listing | api_reads
    # the daemons move ended jobs into the archive and make its months (0027)
    assert _routines(url, names.worker) == {"archive_move", "archive_ensure"} | archived_id
    with psycopg.connect(url, autocommit=True) as conn:
        # the enqueuer may cancel (status and what goes with it), nothing else
        updatable = conn.execute(
            "SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute AS a "
            "WHERE a.attrelid = 'jobsd.jobs'::regclass AND a.attnum > 0 "
            "  AND NOT a.attisdropped AND has_column_privilege(%s, a.attrelid, a.attnum, 'UPDATE')",
            (names.enqueue,),
        ).fetchone()
        assert updatable == (
            [
                "cancel_requested_at",
                "dedup_key",
                "error",
                "finished_at",
                "has_dependents",
                "reason",
                "status",
            ],
        )
        # the owner owns the schema and everything in it
        owners = conn.execute(
            "SELECT DISTINCT r.rolname FROM ("
            "  SELECT relowner AS owner FROM pg_class "
            "  WHERE relnamespace = 'jobsd'::regnamespace"
            "  UNION ALL SELECT proowner FROM pg_proc WHERE pronamespace = 'jobsd'::regnamespace"
            "  UNION ALL SELECT nspowner FROM pg_namespace WHERE nspname = 'jobsd'"
            ") AS o JOIN pg_roles AS r ON r.oid = o.owner"
        ).fetchall()
        assert owners == [(names.owner,)]
        # no jobsd role has powers beyond its grants
        powers = conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s) AND (rolsuper OR rolcreaterole"
            " OR rolcreatedb OR rolreplication OR rolbypassrls OR NOT rolcanlogin)",
            (list(names.by_kind().values()),),
        ).fetchall()
        assert powers == []


def test_create_is_idempotent_and_converges(roles: Roles) -> None:
    names, url = roles.names, roles.db_url
    before = {kind: _privileges(url, name) for kind, name in names.by_kind().items()}
    routines = {kind: _routines(url, name) for kind, name in names.by_kind().items()}
    with psycopg.connect(url, autocommit=True) as conn:  # an operator's stray grants
        conn.execute(sql.SQL("GRANT DELETE ON jobsd.jobs TO {}").format(sql.Identifier(names.read)))
        conn.execute(
            sql.SQL("GRANT EXECUTE ON FUNCTION jobsd.queue_drop(text) TO {}").format(
                sql.Identifier(names.worker)
            )
        )
    assert "queue_drop" in _routines(url, names.worker)
    report = create_roles(url, prefix=names.owner.removesuffix("_owner"))
    assert report.created == [] and report.adopted == []
    assert sorted(report.existing) == sorted(names.by_kind().values())
    after = {kind: _privileges(url, name) for kind, name in names.by_kind().items()}
    assert after == before  # the stray DELETE is gone again
    assert {kind: _routines(url, name) for kind, name in names.by_kind().items()} == routines


def test_later_tables_are_readable_by_the_read_role(roles: Roles) -> None:
    # what a later migration, run as the owner, creates
    with psycopg.connect(roles.url("owner"), autocommit=True) as conn:
        conn.execute("CREATE TABLE jobsd.later (id int)")
    assert "later:SELECT" in _privileges(roles.db_url, roles.names.read)
    assert not any(p.startswith("later:") for p in _privileges(roles.db_url, roles.names.worker))


def test_owner_runs_migrations_and_others_cannot(roles: Roles) -> None:
    assert migrate_sync(roles.url("owner")) == []  # up to date, and allowed to check
    assert all(m.applied for m in migration_status_sync(roles.url("worker")))
    with pytest.raises(DatabaseError, match="migrate failed: permission denied"):
        migrate_sync(roles.url("read"))


@pytest.mark.anyio
async def test_enqueue_work_and_read_under_their_roles(roles: Roles) -> None:
    registry = Registry()

    @jobsd.handler("t", registry=registry)
    async def t(ctx: jobsd.JobContext) -> dict[str, Any]:
        return {"seen": ctx.payload["n"]}

    # the enqueuer: its org in the connection options (one tenant per connection) ...
    async with jobsd.Client(roles.url("enqueue", org="acme")) as client:
        first = await client.enqueue("t", {"n": 1}, org_id="acme")
    # ... or in the application's own transaction (many tenants on one pool)
    app = jobsd.Client(roles.url("enqueue"))
    async with (
        await psycopg.AsyncConnection.connect(roles.url("enqueue")) as conn,
        conn.transaction(),
    ):
        await conn.execute("SELECT set_config('jobsd.org_id', 'zenith', true)")
        second = await app.enqueue("t", {"n": 2}, org_id="zenith", conn=conn)
    assert first.status == second.status == jobsd.JobStatus.QUEUED

    # the worker: every org, end to end
    check_sees_all_orgs(roles.url("worker"))
    settings = Settings(database_url=roles.url("worker"), **FAST)
    async with await psycopg.AsyncConnection.connect(roles.db_url, autocommit=True) as admin:
        async with running_daemon(settings, registry):

            async def both_done() -> bool:
                cur = await admin.execute(
                    "SELECT count(*) FROM jobsd.jobs WHERE status = 'succeeded' AND id = ANY(%s)",
                    ([first.id, second.id],),
                )
                row = await cur.fetchone()
                return row is not None and row[0] == 2

            await wait_until(both_done, what="both jobs to succeed")
        cur = await admin.execute(
            "SELECT from_status, to_status, worker_id FROM jobsd.all_job_events "
            "WHERE job_id = %s ORDER BY id",
            (first.id,),
        )
        history = await cur.fetchall()
    assert [(f, t) for f, t, _ in history] == [
        (None, "queued"),
        ("queued", "running"),
        ("running", "succeeded"),
    ]
    assert history[-1][2] == settings.worker_id

    # the reader: its org's job and history, never the other org's
    async with jobsd.Client(roles.url("read", org="acme")) as reader:
        job = await reader.get(first.id)
        assert job.status == jobsd.JobStatus.SUCCEEDED and job.report == {"seen": 1}
        assert [e.to_status for e in await reader.events(first.id)] == [
            "queued",
            "running",
            "succeeded",
        ]
        with pytest.raises(JobNotFound):
            await reader.get(second.id)


@pytest.mark.anyio
async def test_a_bulk_enqueue_under_row_level_security_inserts_instead_of_copying(
    roles: Roles,
) -> None:
    # COPY FROM does not run where row-level security applies: the batch still goes in
    size = BULK_COPY_MIN_JOBS
    specs = [JobSpec.build("t", {"i": i}, org_id="acme") for i in range(size)]
    async with jobsd.Client(roles.url("enqueue", org="acme")) as client:
        jobs = await client.enqueue_many(specs)
        again = await client.enqueue_many(specs)  # the connection knows by now
        assert [j.id for j in jobs] == [s.id for s in specs]
        assert again == jobs
        with pytest.raises(DatabaseError, match="violates row-level security policy"):
            await client.enqueue_many([JobSpec.build("t", {}, org_id="other") for _ in range(size)])
    async with await psycopg.AsyncConnection.connect(roles.db_url) as admin:
        cur = await admin.execute("SELECT org_id, count(*) FROM jobsd.jobs GROUP BY org_id")
        assert await cur.fetchall() == [("acme", size)]


@pytest.mark.anyio
async def test_a_batch_enqueue_under_row_level_security_inserts_instead_of_copying(
    roles: Roles,
) -> None:
    size = BATCH_COPY_MIN_JOBS
    async with jobsd.Client(roles.url("enqueue", org="acme")) as client:
        first = await client.enqueue_batch("t", [{"i": i} for i in range(size)], org_id="acme")
        second = await client.enqueue_batch("t", [{}] * size, org_id="acme")  # known by now
        with pytest.raises(DatabaseError, match="violates row-level security policy"):
            await client.enqueue_batch("t", [{}] * size, org_id="other")
    async with await psycopg.AsyncConnection.connect(roles.db_url) as admin:
        cur = await admin.execute("SELECT id FROM jobsd.jobs WHERE org_id = 'acme' ORDER BY id")
        assert [r[0] for r in await cur.fetchall()] == first + second
        cur = await admin.execute("SELECT count(*) FROM jobsd.jobs WHERE org_id <> 'acme'")
        assert await cur.fetchone() == (0,)


@pytest.mark.anyio
async def test_less_privilege_fails_clearly(roles: Roles) -> None:
    # (the worker role enqueues: the scheduler of periodic jobs runs in the daemon)
    for kind in ("read",):
        async with jobsd.Client(roles.url(kind, org="acme")) as client:
            with pytest.raises(DatabaseError) as info:
                await client.enqueue("t", {}, org_id="acme")
        message = str(info.value)
        assert "enqueue of 't' into queue 'default' failed" in message, kind
        assert "permission denied for table jobs" in message, kind

    # an enqueuer that forgot to set its org, or set another one, writes nothing
    for url in (roles.url("enqueue"), roles.url("enqueue", org="other")):
        async with jobsd.Client(url) as client:
            with pytest.raises(DatabaseError, match="violates row-level security policy"):
                await client.enqueue("t", {}, org_id="acme")

    # the enqueuer cannot claim, the reader cannot cancel
    async with await psycopg.AsyncConnection.connect(
        roles.url("enqueue", org="acme"), autocommit=True
    ) as conn:
        with pytest.raises(DatabaseError, match="permission denied for table jobs"):
            await queries.claim_batch(
                conn, limit=1, worker_id="intruder", queues=None, keep_dedup_types=[]
            )
    async with await psycopg.AsyncConnection.connect(
        roles.url("read", org="acme"), autocommit=True
    ) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            await queries.run_named(conn, "api_jobs_cancel", {"id": uuid.uuid4(), "org_id": "acme"})

    with psycopg.connect(roles.db_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM jobsd.jobs").fetchone()
    assert row == (0,)  # nothing was half-written

    # a daemon under a role that sees one org would idle: its start check says so
    for kind in ("read", "enqueue"):
        with pytest.raises(ConfigError, match=r"sees only the jobs of the org in jobsd\.org_id"):
            check_sees_all_orgs(roles.url(kind))
    for url in (roles.url("worker"), roles.url("owner"), roles.db_url):
        check_sees_all_orgs(url)


@pytest.fixture
def prefix(admin_url: str) -> Iterator[str]:
    """A unique role prefix; whatever roles a test made with it are dropped after."""
    value = f"t{uuid.uuid4().hex[:10]}"
    yield value
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for kind in ROLE_KINDS:
            conn.execute(
                sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(f"{value}_{kind}"))
            )


def test_refusals_before_anything_is_created(
    db_url: str, admin_url: str, prefix: str, roles: Roles
) -> None:
    names = RoleNames.for_prefix(prefix)
    existing = [names.owner, names.enqueue, names.worker, names.read]

    def created() -> list[str]:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s) ORDER BY 1", (existing,)
            ).fetchall()
        return [r[0] for r in rows]

    with pytest.raises(ConfigError, match="invalid role prefix"):
        create_roles(db_url, prefix="Bad-Prefix")
    with pytest.raises(ConfigError, match="unknown role kind 'superuser'"):
        create_roles(db_url, prefix=prefix, passwords={"superuser": "x"})
    # not a superuser
    with pytest.raises(ConfigError, match="must run as a superuser"):
        create_roles(roles.url("owner"), prefix=prefix)
    # a role of that name with powers a jobsd role must not have: all or nothing
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} BYPASSRLS").format(sql.Identifier(names.worker)))
    with pytest.raises(ConfigError, match=f"role '{names.worker}' already exists with BYPASSRLS"):
        create_roles(db_url, prefix=prefix)
    assert created() == [names.worker]
    # an unmigrated database
    empty = f"empty_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(empty)))
    try:
        with pytest.raises(ConfigError, match="run `jobsd migrate` first"):
            create_roles(psycopg.conninfo.make_conninfo(admin_url, dbname=empty), prefix="tz")
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(empty)))


def _cli() -> click.Group:
    return jobsd_main


def test_cli_create_with_passwords(db_url: str, prefix: str) -> None:
    runner = CliRunner()
    env = {
        "JOBSD_DATABASE_URL": db_url,
        "JOBSD_ALLOW_INSECURE": "1",  # the test server listens on plain TCP
        "WORKER_PW": "correct horse battery staple",
    }
    args = ["roles", "create", "--prefix", prefix, "--password-env", "worker=WORKER_PW"]
    try:
        result = runner.invoke(_cli(), args, env=env)
        assert result.exit_code == 0, result.output
        assert "jobsd: warning: TCP host 127.0.0.1 with sslmode=prefer (allowed by" in result.output
        assert f"created role {prefix}_worker" in result.output
        assert f"password set for {prefix}_worker" in result.output
        assert "TABLE jobsd.jobs now owned by" in result.output
        with psycopg.connect(db_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT rolname, rolpassword FROM pg_authid WHERE rolname LIKE %s ORDER BY 1",
                (f"{prefix}_%",),
            ).fetchall()
        passwords = dict(rows)
        assert passwords[f"{prefix}_worker"].startswith("SCRAM-SHA-256$4096:")
        assert passwords[f"{prefix}_read"] is None  # no password given: none set

        again = runner.invoke(_cli(), args[:4], env=env)
        assert again.exit_code == 0, again.output
        assert f"role {prefix}_worker exists" in again.output
        assert "now owned by" not in again.output
    finally:
        drop_roles(db_url, prefix=prefix)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {"JOBSD_ALLOW_INSECURE": "0"}, "refusing an unencrypted database connection"),
        (["--password-env", "worker"], {}, "use KIND=VARIABLE"),
        (["--password-env", "boss=X"], {}, "use KIND=VARIABLE"),
        (["--password-env", "read=UNSET_VAR"], {}, "UNSET_VAR is empty"),
    ],
)
def test_cli_errors_are_one_line(
    db_url: str, prefix: str, args: list[str], env: dict[str, str], message: str
) -> None:
    full_env = {"JOBSD_DATABASE_URL": db_url, "JOBSD_ALLOW_INSECURE": "1", **env}
    result = CliRunner().invoke(
        _cli(), ["roles", "create", "--prefix", prefix, *args], env=full_env
    )
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobsd: error: ") and message in lines[0]
