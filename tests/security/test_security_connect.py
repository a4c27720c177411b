"""Every way jobsd connects applies the TLS policy: no command or client skips the check.

The test server listens on plaintext TCP; with ``JOBSD_ALLOW_INSECURE=0`` every
connection jobsd would open to it must be refused, before anything is read or
written.
"""

from __future__ import annotations

import uuid
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from support.jobs import make_job

import jobsd
import jobsd.http as jobsd_http
from jobsd.cli import main as jobsd_main
from jobsd.client import Client, SyncClient
from jobsd.errors import BackendUnavailable, ConfigError
from jobsd.settings import Settings
from jobsd.store.connect import connect
from jobsd.store.migrate import migrate_sync
from jobsd.worker.supervisor import run_daemon

REFUSED = "refusing an unencrypted database connection"
QUEUED_JOB = uuid.UUID("01970f3a-1c2b-7d4e-8f00-123456789abc")

COMMANDS = [
    ["migrate"],
    ["enqueue", "noop", "--org", "acme"],
    ["status", str(QUEUED_JOB)],
    ["cancel", str(QUEUED_JOB)],
    ["resolve", str(QUEUED_JOB), "--failed"],
    ["notify", "off"],
    ["token", "create", "--org", "acme"],
    ["token", "revoke", str(uuid.uuid4())],
    ["token", "list"],
    # issue 12: every other command that connects
    ["queue", "list"],
    ["queue", "create", "hostile"],
    ["prune"],
    ["export"],
    ["roles", "create"],
    ["run"],
    ["api", "--addr", "127.0.0.1:0"],
    ["jobs", "list"],
    ["retry", str(QUEUED_JOB)],
    ["queue", "set", "default", "--capacity", "5"],
    ["queue", "pause", "default"],
    ["queue", "resume", "default"],
    ["schedule", "list"],
    ["schedule", "pause", "nightly"],
    ["schedule", "resume", "nightly"],
    ["top", "--once"],
    ["demo", "crash"],
]


def _state(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    """Return what a command could change: jobs and their states, tokens, the switch,
    the queues' limits and pauses, the schedules."""
    jobs = conn.execute("SELECT id, status FROM jobsd.jobs ORDER BY id").fetchall()
    events = conn.execute("SELECT count(*) FROM jobsd.all_job_events").fetchone()
    tokens = conn.execute("SELECT id, revoked_at FROM jobsd.api_tokens ORDER BY id").fetchall()
    notify = conn.execute(
        "SELECT tgenabled FROM pg_trigger WHERE tgname = 'jobs_notify_insert'"
    ).fetchone()
    queues = conn.execute("SELECT to_jsonb(q) FROM jobsd.queues q ORDER BY name").fetchall()
    schedules = conn.execute("SELECT to_jsonb(s) FROM jobsd.schedules s ORDER BY id").fetchall()
    return (jobs, events, tokens, notify, queues, schedules)


@pytest.mark.parametrize("args", COMMANDS, ids=lambda args: " ".join(args[:2]))
def test_every_command_that_connects_refuses_plaintext_tcp(
    db_url: str, conn: psycopg.Connection[Any], args: list[str]
) -> None:
    make_job(conn, id=QUEUED_JOB, org_id="acme", type="noop")
    conn.execute(
        "INSERT INTO jobsd.schedules (id, type, org_id, queue, every_ms)"
        " VALUES ('nightly', 'noop', 'acme', 'default', 86400000)"
    )
    before = _state(conn)
    env = {"JOBSD_DATABASE_URL": db_url, "JOBSD_ALLOW_INSECURE": "0"}
    result = CliRunner().invoke(jobsd_main, args, env=env)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobsd: error: "), result.output
    assert REFUSED in lines[0]
    assert _state(conn) == before


def test_clients_and_migrations_refuse_plaintext_tcp(
    db_url: str, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "0")
    with pytest.raises(ConfigError, match=REFUSED):
        Client(db_url)
    with pytest.raises(ConfigError, match=REFUSED):
        SyncClient(db_url)
    with pytest.raises(ConfigError, match=REFUSED):
        migrate_sync(db_url)
    assert conn.execute("SELECT count(*) FROM jobsd.jobs").fetchone() == (0,)

    monkeypatch.setenv("JOBSD_DATABASE_URL", db_url)
    with pytest.raises(ConfigError, match=REFUSED):
        jobsd.enqueue_sync("noop", org_id="acme")
    with pytest.raises(ConfigError, match=REFUSED):
        anyio.run(partial(jobsd.enqueue, "noop", org_id="acme"))
    with pytest.raises(ConfigError, match=REFUSED):
        run_daemon(Settings(database_url=db_url))

    async def mounted() -> None:
        app = FastAPI(lifespan=None)
        app.include_router(
            jobsd_http.router(org_dependency=lambda: "acme", settings=Settings(database_url=db_url))
        )
        async with app.router.lifespan_context(app):
            pass

    with pytest.raises(ConfigError, match=REFUSED):
        anyio.run(mounted)
    assert conn.execute("SELECT count(*) FROM jobsd.jobs").fetchone() == (0,)

    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "1")  # what the test session runs with
    with SyncClient(db_url) as client:
        job = client.enqueue("noop", org_id="acme")
    assert conn.execute("SELECT id FROM jobsd.jobs").fetchall() == [(job.id,)]


def test_scram_is_required_when_asked_even_in_development(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test server trusts TCP (no password): require_auth=scram-sha-256 refuses it."""
    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "1")
    monkeypatch.setenv("JOBSD_REQUIRE_SCRAM", "1")
    with (
        pytest.raises(BackendUnavailable, match="scram-sha-256"),
        connect(db_url, application_name="t", operation="probe"),
    ):
        pass
    monkeypatch.setenv("JOBSD_REQUIRE_SCRAM", "0")
    with connect(db_url, application_name="t", operation="probe") as conn:
        assert conn.execute("SELECT 1").fetchone() == {"?column?": 1}


def test_the_database_url_comes_from_the_systemd_credential(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """LoadCredential=database_url:... puts the URL in $CREDENTIALS_DIRECTORY, not in
    the environment: every command reads it there when JOBSD_DATABASE_URL is unset."""
    (tmp_path / "database_url").write_text(db_url + "\n")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "JOBSD_DATABASE_URL": None}
    runner = CliRunner()
    enqueued = runner.invoke(jobsd_main, ["enqueue", "noop", "--org", "acme"], env=env)
    assert enqueued.exit_code == 0, enqueued.output
    job_id = uuid.UUID(enqueued.stdout.strip())
    assert conn.execute("SELECT id FROM jobsd.jobs").fetchall() == [(job_id,)]
    listed = runner.invoke(jobsd_main, ["queue", "list"], env=env)
    assert listed.exit_code == 0 and "default" in listed.stdout, listed.output
    # the environment wins when set; no credential and no variable: a clear error
    (tmp_path / "database_url").unlink()
    missing = runner.invoke(jobsd_main, ["queue", "list"], env=env)
    assert missing.exit_code == 1 and "no database configured" in missing.output
