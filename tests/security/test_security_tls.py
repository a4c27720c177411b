"""A server configured for production: ssl=on, hostssl only, scram-sha-256.

One cluster for the module: initdb'd with trust for the local superuser (the setup
goes over the unix socket), then given a self-signed certificate made here with the
openssl CLI, ``ssl = on`` and a pg_hba.conf with a single TCP line, ``hostssl ...
scram-sha-256``, and restarted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from support.daemon import running_daemon

import jobsd
from jobsd.dev.embedded import EmbeddedPostgres
from jobsd.errors import ConfigError
from jobsd.registry import Registry
from jobsd.settings import Settings
from jobsd.store.migrate import migrate_sync
from jobsd.store.tls import check_connection_security

from .conftest import FAST, wait_until

APP_USER = "app"
APP_DB = "jobsd_tls"


@dataclass(frozen=True)
class TlsServer:
    cluster: EmbeddedPostgres
    password: str
    ca_file: Path

    def tcp(self, **params: Any) -> str:
        """Return a TCP conninfo for the app user; ``params`` add or override."""
        base = {"host": "127.0.0.1", "port": self.cluster.port, "dbname": APP_DB}
        base |= {"user": APP_USER, "passfile": os.devnull}
        return make_conninfo("", **{**base, **params})

    def secure(self, **params: Any) -> str:
        """Return the production URL: verify-full against our CA, with the password."""
        return self.tcp(
            sslmode="verify-full", sslrootcert=str(self.ca_file), password=self.password, **params
        )

    def socket(self, dbname: str = "postgres") -> str:
        """Return the superuser's unix-socket conninfo."""
        sock = self.cluster.base_dir / "sock"
        return make_conninfo(
            "", host=str(sock), port=self.cluster.port, user="postgres", dbname=dbname
        )


def _make_certificate(directory: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is needed to make a self-signed certificate")
    key, cert = directory / "server.key", directory / "server.crt"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return key, cert


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    """Start the module's cluster, then switch it to TLS + SCRAM only."""
    cluster = EmbeddedPostgres(
        extra_conf={"password_encryption": "scram-sha-256"},
        hba_lines=["local all postgres trust"],
    )
    try:
        cluster.start()
        data = cluster.data_dir
        key, cert = _make_certificate(data)  # server.key and server.crt: the default names
        owner = data.stat()
        os.chown(key, owner.st_uid, owner.st_gid)  # Postgres runs as jobsd-pg when we are root
        os.chown(cert, owner.st_uid, owner.st_gid)
        key.chmod(0o600)
        ca_file = tmp_path_factory.mktemp("tls") / "root.crt"
        shutil.copy(cert, ca_file)
        password = uuid.uuid4().hex
        server = TlsServer(cluster, password, ca_file)
        with psycopg.connect(server.socket(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET ssl = on")
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(APP_USER), sql.Literal(password)
                )
            )
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(APP_DB), sql.Identifier(APP_USER)
                )
            )
        (data / "pg_hba.conf").write_text(
            "local   all  postgres                 trust\n"
            "hostssl all  all       127.0.0.1/32   scram-sha-256\n"
        )
        cluster.restart()
        yield server
    finally:
        cluster.cleanup()


def test_plain_tcp_is_refused_by_the_server(tls_server: TlsServer) -> None:
    url = tls_server.tcp(sslmode="disable", password=tls_server.password)
    with pytest.raises(psycopg.OperationalError, match=r"no pg_hba\.conf entry .* no encryption"):
        psycopg.connect(url).close()


def test_a_connection_without_password_is_refused(
    tls_server: TlsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(tls_server.tcp(sslmode="require")).close()
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(tls_server.tcp(sslmode="require", password="wrong")).close()


def test_tls_and_scram_are_in_use(tls_server: TlsServer) -> None:
    # channel_binding=require succeeds only with SCRAM-SHA-256-PLUS over TLS
    with psycopg.connect(tls_server.secure(channel_binding="require")) as conn:
        row = conn.execute(
            "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        ).fetchone()
        assert row is not None and row[0] is True and row[1].startswith("TLSv1.")
    with psycopg.connect(tls_server.socket(), autocommit=True) as conn:
        stored = conn.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = %s", (APP_USER,)
        ).fetchone()
    assert stored is not None and stored[0].startswith("SCRAM-SHA-256$")


def test_jobsd_refuses_weak_sslmodes_toward_it_on_its_own_side(tls_server: TlsServer) -> None:
    for mode in ("disable", "allow", "prefer"):
        url = tls_server.tcp(sslmode=mode, password=tls_server.password)
        with pytest.raises(ConfigError, match=f"127.0.0.1 with sslmode={mode}"):
            check_connection_security(url, allow_insecure=False)
    for mode in ("require", "verify-ca", "verify-full"):
        check_connection_security(tls_server.tcp(sslmode=mode), allow_insecure=False)
    check_connection_security(tls_server.socket(), allow_insecure=False)
    # and the server agrees: the local socket works without TLS
    with psycopg.connect(tls_server.socket()) as conn:
        assert conn.execute(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        ).fetchone() == (False,)


@pytest.mark.anyio
async def test_jobs_run_end_to_end_over_tls_with_a_password(tls_server: TlsServer) -> None:
    url = tls_server.secure()
    check_connection_security(url, allow_insecure=False)
    await anyio.to_thread.run_sync(migrate_sync, url)  # as the database owner, over TLS

    registry = Registry()

    @jobsd.handler("t", registry=registry)
    async def t(ctx: jobsd.JobContext) -> dict[str, Any]:
        return {"doubled": ctx.payload["n"] * 2}

    async with jobsd.Client(url) as client:
        job = await client.enqueue("t", {"n": 21}, org_id="acme")
        async with running_daemon(Settings(database_url=url, **FAST), registry):

            async def finished() -> jobsd.Job | None:
                current = await client.get(job.id)
                return current if current.status == jobsd.JobStatus.SUCCEEDED else None

            done = await wait_until(finished, what="the job to succeed")
            # every connection the daemon and the client hold is encrypted
            async with await psycopg.AsyncConnection.connect(url) as conn:
                cur = await conn.execute(
                    "SELECT a.application_name, s.ssl FROM pg_stat_activity AS a "
                    "JOIN pg_stat_ssl AS s USING (pid) "
                    "WHERE a.datname = current_database() AND a.application_name LIKE 'jobsd-%%'"
                )
                sessions = await cur.fetchall()
    assert done.report == {"doubled": 42}
    assert {name for name, _ in sessions} >= {"jobsd-daemon", "jobsd-listen", "jobsd-client"}
    assert all(ssl for _, ssl in sessions)


def test_jobsd_requires_scram_and_warns_when_the_server_is_not_verified(
    tls_server: TlsServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 12: JOBSD_REQUIRE_SCRAM (on by default without JOBSD_ALLOW_INSECURE) passes
    libpq require_auth=scram-sha-256; sslmode below verify-full is logged."""
    from jobsd.store.connect import connect

    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "0")
    monkeypatch.delenv("JOBSD_REQUIRE_SCRAM", raising=False)
    with connect(tls_server.secure(), application_name="t", operation="probe") as conn:
        options = {o.keyword: o.val for o in conn.pgconn.info}
        assert options[b"require_auth"] == b"scram-sha-256"
    assert "security.server_not_verified" not in caplog.text
    weak = tls_server.tcp(sslmode="require", password=tls_server.password)
    with connect(weak, application_name="t", operation="probe"):
        pass
    assert "security.server_not_verified" in caplog.text
