"""The connection check: which URLs jobsd refuses, read the way libpq resolves them."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from jobsd.errors import ConfigError
from jobsd.store import connect as connect_module
from jobsd.store.tls import (
    SecuritySettings,
    allow_insecure,
    check_connection_security,
    insecure_reason,
    require_secure_connection,
)

REFUSED = [
    "postgresql://app@db.example.com/jobs",  # libpq's default sslmode is prefer
    "postgresql://app@db.example.com/jobs?sslmode=disable",
    "postgresql://app@db.example.com/jobs?sslmode=allow",
    "postgresql://app@db.example.com/jobs?sslmode=prefer",
    "postgresql://app@127.0.0.1:5432/jobs?sslmode=disable",  # loopback TCP is TCP
    "postgresql://app@[::1]/jobs",
    "host=localhost dbname=jobs sslmode=prefer",
    "host=/run/postgresql,db.example.com dbname=jobs",  # one TCP host in the list
    "postgresql://app@/jobs?hostaddr=10.0.0.5",  # hostaddr means TCP
    "host=/run/postgresql hostaddr=10.0.0.5 dbname=jobs",
]

ACCEPTED = [
    "postgresql://app@db.example.com/jobs?sslmode=require",
    "postgresql://app@db.example.com/jobs?sslmode=verify-ca",
    "postgresql://app@db.example.com/jobs?sslmode=verify-full&sslrootcert=/etc/jobsd/ca.crt",
    "host=db1,db2 dbname=jobs sslmode=verify-full",
    "postgresql://app@db.example.com/jobs?gssencmode=require",  # Kerberos encryption
    "postgresql:///jobs",  # libpq's default: the local unix socket
    "postgresql://app@/jobs?host=/run/postgresql",
    "postgresql://app@%2Frun%2Fpostgresql/jobs",
    "host=/tmp dbname=jobs sslmode=disable",  # sslmode does not matter on a socket
    "host=@jobsd-abstract dbname=jobs",
    "dbname=jobs",
]


@pytest.mark.parametrize("url", REFUSED)
def test_refuses_plaintext_tcp(url: str) -> None:
    with pytest.raises(ConfigError, match="refusing an unencrypted database connection") as info:
        check_connection_security(url, allow_insecure=False)
    message = str(info.value)
    assert "sslmode=verify-full" in message and "JOBSD_ALLOW_INSECURE=1" in message


@pytest.mark.parametrize("url", ACCEPTED)
def test_accepts_tls_and_unix_sockets(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("PGHOST", "PGHOSTADDR", "PGSSLMODE", "PGSERVICE", "PGREQUIRESSL"):
        monkeypatch.delenv(var, raising=False)
    check_connection_security(url, allow_insecure=False)


def test_allow_insecure_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    check_connection_security("postgresql://app@db/jobs?sslmode=disable", allow_insecure=True)


def test_message_names_host_and_sslmode_never_the_password() -> None:
    url = "postgresql://app:s3cret@db.example.com:6432/jobs?sslmode=allow"
    with pytest.raises(ConfigError) as info:
        check_connection_security(url, allow_insecure=False)
    assert "db.example.com" in str(info.value) and "sslmode=allow" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_environment_defaults_like_libpq() -> None:
    # no host in the URL: PGHOST decides; no sslmode: PGSSLMODE decides
    assert insecure_reason("postgresql:///jobs", {"PGHOST": "db"}) is not None
    assert insecure_reason("postgresql:///jobs", {"PGHOST": "/run/postgresql"}) is None
    assert insecure_reason("postgresql:///jobs", {"PGHOST": "db", "PGSSLMODE": "require"}) is None
    assert insecure_reason("postgresql:///jobs", {"PGHOSTADDR": "10.1.2.3"}) is not None
    # the URL wins over the environment
    env = {"PGHOST": "/run/postgresql", "PGSSLMODE": "verify-full"}
    assert insecure_reason("postgresql://db/jobs?sslmode=disable", env) is not None
    assert insecure_reason("postgresql://db/jobs", env) is None
    # the deprecated requiressl=1 still means require
    assert insecure_reason("postgresql://db/jobs", {"PGREQUIRESSL": "1"}) is None


def test_connection_service_file(tmp_path: Path) -> None:
    services = tmp_path / "pg_service.conf"
    services.write_text(
        "# jobsd services\n"
        "[plain]\nhost=db.example.com\ndbname=jobs\n\n"
        "[tls]\nhost=db.example.com\nsslmode=verify-full\n\n"
        "[local]\nhost=/run/postgresql\n"
    )
    env = {"PGSERVICEFILE": str(services), "PGSYSCONFDIR": str(tmp_path / "none")}
    assert insecure_reason("service=plain", env) is not None
    assert insecure_reason("service=tls", env) is None
    assert insecure_reason("service=local", env) is None
    assert insecure_reason("dbname=jobs", {**env, "PGSERVICE": "plain"}) is not None
    # the URL wins over the service, the service over the environment
    assert insecure_reason("service=plain sslmode=require", env) is None
    assert insecure_reason("service=tls", {**env, "PGSSLMODE": "disable"}) is None
    with pytest.raises(ConfigError, match="connection service 'missing' not found"):
        insecure_reason("service=missing", env)
    # allowed insecure: an unreadable configuration does not stop a development setup
    check_connection_security("service=missing", allow_insecure=True)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("postgresql://db/jobs?sslmode=maybe", "invalid sslmode 'maybe'"),
        ("postgresql://db/jobs?gssencmode=always", "invalid gssencmode"),
        ("host=db dbname='unterminated", "invalid database URL"),
    ],
)
def test_invalid_settings_are_config_errors(url: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_connection_security(url, allow_insecure=False)


def test_allow_insecure_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOBSD_ALLOW_INSECURE", raising=False)
    assert allow_insecure() is False
    for value, expected in (("1", True), ("true", True), ("0", False), ("false", False)):
        monkeypatch.setenv("JOBSD_ALLOW_INSECURE", value)
        assert SecuritySettings().allow_insecure is expected
        assert allow_insecure() is expected


def test_require_secure_connection_raises_or_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = "postgresql://app@db.example.com/jobs?sslmode=disable"
    monkeypatch.delenv("JOBSD_ALLOW_INSECURE", raising=False)
    with pytest.raises(ConfigError, match=r"db\.example\.com"):
        require_secure_connection(url)

    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "1")
    with caplog.at_level(logging.WARNING, logger="jobsd.store.tls"):
        assert require_secure_connection(url) == "TCP host db.example.com with sslmode=disable"
    warnings = [
        r for r in caplog.records if r.getMessage() == "security.insecure_connection_allowed"
    ]
    assert len(warnings) == 1
    assert "sslmode=disable" in warnings[0].__dict__["reason"]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jobsd.store.tls"):
        assert require_secure_connection("postgresql://db.example.com/jobs?sslmode=require") is None
    assert not caplog.records  # nothing to warn about


def test_connect_warns_once_per_url_and_trusts_the_dev_cluster(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from jobsd.store.connect import check_url, trust_local_cluster

    url = f"postgresql://app@db.example.com/jobs_{uuid.uuid4().hex}?sslmode=disable"
    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "1")
    with caplog.at_level(logging.WARNING, logger="jobsd.store.tls"):
        assert check_url(url) == "TCP host db.example.com with sslmode=disable"
        assert check_url(url) == "TCP host db.example.com with sslmode=disable"
    assert [r.getMessage() for r in caplog.records] == ["security.insecure_connection_allowed"]

    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "0")
    with pytest.raises(ConfigError, match="refusing an unencrypted database connection"):
        check_url(url)  # warned once: still refused once the setting is gone
    local = f"postgresql://postgres@127.0.0.1:1/dev_{uuid.uuid4().hex}"
    with pytest.raises(ConfigError):
        check_url(local)
    trust_local_cluster(local)  # what `jobsd dev` does for the cluster it started
    assert check_url(local) is None


# -- issue 12: SCRAM required, unverified servers named -------------------------------


def test_scram_is_required_on_tcp_unless_development_or_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobsd.store.tls import auth_params

    tcp = "postgresql://app@db.example:5432/app?sslmode=verify-full"
    monkeypatch.delenv("JOBSD_REQUIRE_SCRAM", raising=False)
    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "0")
    assert auth_params(tcp, {}) == {"require_auth": "scram-sha-256"}
    assert auth_params("postgresql:///app?host=/run/postgresql", {}) == {}
    assert auth_params(tcp + "&require_auth=scram-sha-256,md5", {}) == {}  # the URL decides
    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "1")
    assert auth_params(tcp, {}) == {}
    monkeypatch.setenv("JOBSD_REQUIRE_SCRAM", "1")
    assert auth_params(tcp, {}) == {"require_auth": "scram-sha-256"}
    monkeypatch.setenv("JOBSD_REQUIRE_SCRAM", "0")
    monkeypatch.setenv("JOBSD_ALLOW_INSECURE", "0")
    assert auth_params(tcp, {}) == {}


@pytest.mark.parametrize(
    ("url", "unverified"),
    [
        ("postgresql://h/db?sslmode=verify-full", False),
        ("postgresql://h/db?sslmode=verify-ca", True),
        ("postgresql://h/db?sslmode=require", True),
        ("postgresql:///db?host=/run/postgresql", False),
    ],
)
def test_a_server_not_verified_is_named(url: str, unverified: bool) -> None:
    from jobsd.store.tls import unverified_reason

    reason = unverified_reason(url, {})
    assert (reason is not None) == unverified
    if reason:
        assert "verify-full" in reason


def test_every_plaintext_host_of_a_multi_host_url_is_named() -> None:
    reason = insecure_reason("host=db1.example.com,db2.example.com dbname=jobs", {})
    assert reason is not None and "db1.example.com, db2.example.com" in reason
    assert insecure_reason("host=db1,db2 port=5432,5433 sslmode=verify-full", {}) is None


@pytest.mark.parametrize(
    ("url", "writable", "expected"),
    [
        ("host=/run/postgresql dbname=jobs", True, "read-write"),
        ("postgresql://app@db1:5432,db2:5432/jobs?sslmode=require", True, "read-write"),
        ("host=/run/postgresql dbname=jobs", False, None),
        ("host=/run/postgresql dbname=jobs target_session_attrs=primary", True, None),
    ],
)
def test_writes_go_to_a_server_that_accepts_them(
    url: str, writable: bool, expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """jobsd's own connections take only a writable server of those a URL lists,
    unless the URL (or PGTARGETSESSIONATTRS) says otherwise; a replica's do not."""
    monkeypatch.delenv("PGTARGETSESSIONATTRS", raising=False)
    monkeypatch.setenv("JOBSD_REQUIRE_SCRAM", "0")
    params = connect_module._params(url, "jobsd-test", writable=writable)
    assert params.get("target_session_attrs") == expected
    monkeypatch.setenv("PGTARGETSESSIONATTRS", "any")
    assert "target_session_attrs" not in connect_module._params(url, "jobsd-test")
