"""Refuse plaintext TCP connections to Postgres unless the operator allows them.

The check reads the connection settings the way libpq resolves them: the URL or
``key=value`` string first, then a connection service (``service=`` or ``PGSERVICE``),
then the ``PG*`` environment variables, then libpq's built-in defaults (a unix socket,
``sslmode=prefer``). A TCP host needs ``sslmode`` ``require`` or stronger
(``verify-full`` in production) or ``gssencmode=require``; unix sockets (a host
starting with ``/`` or ``@``, or no host at all) are always accepted. ``prefer`` and
``allow`` are refused: an attacker on the path can downgrade them to plaintext.

The check looks at the configuration only and opens no connection.
"""

from __future__ import annotations

import configparser
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import psycopg

from jobsd.envsettings import EnvSettings
from jobsd.errors import ConfigError

__all__ = [
    "SecuritySettings",
    "allow_insecure",
    "auth_params",
    "check_connection_security",
    "insecure_reason",
    "require_secure_connection",
    "unverified_reason",
]

log = logging.getLogger(__name__)

# libpq's sslmode values, weakest first
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_REQUIRED = _SSLMODES.index("require")
_GSSENCMODES = ("disable", "prefer", "require")
_ENV = {"host": "PGHOST", "hostaddr": "PGHOSTADDR", "sslmode": "PGSSLMODE", "port": "PGPORT"}
_ENV |= {"gssencmode": "PGGSSENCMODE", "requiressl": "PGREQUIRESSL", "service": "PGSERVICE"}
_HOW_TO_FIX = (
    "use sslmode=verify-full (or require) in JOBSD_DATABASE_URL, connect over a local "
    "unix socket, or set JOBSD_ALLOW_INSECURE=1 for a development setup"
)


class SecuritySettings(EnvSettings):
    """What the connection check reads from ``JOBSD_*`` variables."""

    allow_insecure: bool = False
    """Accept a plaintext TCP connection to Postgres (development only; logs a warning)."""

    require_scram: bool | None = None
    """Require SCRAM authentication of TCP connections (libpq's
    ``require_auth=scram-sha-256``: a server that asks for a cleartext or MD5 password,
    or for none, is refused). Unset: on, except with ``JOBSD_ALLOW_INSECURE=1``."""


def allow_insecure() -> bool:
    """Return ``JOBSD_ALLOW_INSECURE`` (false when unset)."""
    return SecuritySettings().allow_insecure


def check_connection_security(url: str, *, allow_insecure: bool) -> None:
    """Raise ConfigError if ``url`` would reach a TCP host without TLS.

    With ``allow_insecure`` nothing is raised; the caller logs the warning (or uses
    ``require_secure_connection``, which does both).
    """
    try:
        reason = insecure_reason(url)
    except ConfigError:
        if allow_insecure:
            return
        raise
    if reason is not None and not allow_insecure:
        raise ConfigError(f"refusing an unencrypted database connection: {reason}; {_HOW_TO_FIX}")


def require_secure_connection(url: str, *, warn: bool = True) -> str | None:
    """Check ``url`` against ``JOBSD_ALLOW_INSECURE``: raise, or log a warning when allowed.

    Return why the connection is insecure when it is allowed anyway, else None. With
    ``warn`` false the warning is left to the caller (``store.connect`` logs it once
    per URL).
    """
    allowed = allow_insecure()
    try:
        reason = insecure_reason(url)
    except ConfigError as exc:
        if not allowed:
            raise
        reason = str(exc)
    if reason is None:
        return None
    if not allowed:
        raise ConfigError(f"refusing an unencrypted database connection: {reason}; {_HOW_TO_FIX}")
    if warn:
        log.warning("security.insecure_connection_allowed", extra={"reason": reason})
    return reason


def insecure_reason(url: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Say why ``url`` is not safe to use (None when it is): which host, which sslmode.

    ``environ`` stands for ``os.environ`` (the ``PG*`` defaults); tests pass their own.
    """
    env = os.environ if environ is None else environ
    params = _resolve(url, env)
    tcp_hosts = _tcp_hosts(params.get("host", ""), params.get("hostaddr", ""))
    if not tcp_hosts:
        return None
    sslmode = params.get("sslmode", "")
    if not sslmode and params.get("requiressl") == "1":
        sslmode = "require"  # deprecated spelling, still honoured by older libpq
    sslmode = sslmode or "prefer"
    if sslmode not in _SSLMODES:
        raise ConfigError(f"invalid sslmode {sslmode!r} (use one of {', '.join(_SSLMODES)})")
    gssencmode = params.get("gssencmode", "") or "prefer"
    if gssencmode not in _GSSENCMODES:
        raise ConfigError(f"invalid gssencmode {gssencmode!r}")
    if _SSLMODES.index(sslmode) >= _REQUIRED or gssencmode == "require":
        return None
    return f"TCP host {', '.join(tcp_hosts)} with sslmode={sslmode}"


def unverified_reason(url: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Say why a TCP connection of ``url`` does not verify the server's certificate and
    name (``sslmode`` other than ``verify-full``); None when it does or is local."""
    env = os.environ if environ is None else environ
    try:
        params = _resolve(url, env)
    except ConfigError:
        return None
    tcp_hosts = _tcp_hosts(params.get("host", ""), params.get("hostaddr", ""))
    sslmode = params.get("sslmode", "") or "prefer"
    if not tcp_hosts or sslmode == "verify-full":
        return None
    return (
        f"TCP host {', '.join(tcp_hosts)} with sslmode={sslmode}: the server's certificate "
        "is not checked against its name, a man in the middle can impersonate it "
        "(use sslmode=verify-full with sslrootcert)"
    )


def auth_params(url: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the libpq parameters that enforce ``JOBSD_REQUIRE_SCRAM`` on ``url``.

    ``require_auth=scram-sha-256`` for a TCP host when SCRAM is required (the default
    unless ``JOBSD_ALLOW_INSECURE``) and the URL does not set ``require_auth`` itself;
    nothing for a unix socket (peer authentication is the local norm). Needs libpq 16
    or newer: an older one refuses to connect rather than skip the check.
    """
    env = os.environ if environ is None else environ
    settings = SecuritySettings()
    required = settings.require_scram
    if required is None:
        required = not settings.allow_insecure
    if not required:
        return {}
    try:
        params = _resolve(url, env)
    except ConfigError:
        return {}
    if "require_auth" in params:
        return {}
    if not _tcp_hosts(params.get("host", ""), params.get("hostaddr", "")):
        return {}
    if psycopg.pq.version() < 160000:
        raise ConfigError(
            f"JOBSD_REQUIRE_SCRAM needs libpq 16 or newer (this one is {psycopg.pq.version()}): "
            "upgrade libpq, or set JOBSD_REQUIRE_SCRAM=0 and check pg_hba.conf yourself"
        )
    return {"require_auth": "scram-sha-256"}


def _resolve(url: str, env: Mapping[str, str]) -> dict[str, str]:
    """Return host, hostaddr, sslmode, ... as libpq would use them."""
    try:
        given = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"invalid database URL: {exc}") from exc
    params = {k: str(v) for k, v in given.items() if v is not None and str(v) != ""}
    service = params.get("service") or env.get("PGSERVICE", "")
    if service:
        for key, value in _service_params(service, env).items():
            params.setdefault(key, value)
    for key, var in _ENV.items():
        if key not in params and env.get(var):
            params[key] = env[var]
    return params


def _service_params(service: str, env: Mapping[str, str]) -> dict[str, str]:
    """Read one section of the connection service files, as libpq looks them up."""
    candidates = [Path(env["PGSERVICEFILE"])] if env.get("PGSERVICEFILE") else []
    if not candidates:
        candidates.append(Path(env.get("HOME") or Path.home()) / ".pg_service.conf")
    sysconf = env.get("PGSYSCONFDIR")
    for directory in [sysconf] if sysconf else ["/etc/postgresql-common", "/etc"]:
        candidates.append(Path(directory) / "pg_service.conf")
    for path in candidates:
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, configparser.Error) as exc:
            raise ConfigError(f"cannot read connection service file {path}: {exc}") from exc
        if parser.has_section(service):
            return {k: v.strip() for k, v in parser.items(service) if v.strip()}
    raise ConfigError(
        f"connection service {service!r} not found in {', '.join(map(str, candidates))}: "
        "jobsd cannot check that it uses TLS; put host and sslmode in JOBSD_DATABASE_URL"
    )


def _tcp_hosts(host: str, hostaddr: str) -> list[str]:
    """List the entries of a (comma-separated) host list that libpq reaches over TCP.

    An entry with a ``hostaddr`` is TCP whatever its host; a host starting with ``/``
    (a socket directory) or ``@`` (an abstract socket) is local, and so is an empty one
    (libpq's default socket directory).
    """
    hosts = [h.strip() for h in host.split(",")] if host else []
    addrs = [a.strip() for a in hostaddr.split(",")] if hostaddr else []
    tcp = []
    for i in range(max(len(hosts), len(addrs))):
        name = hosts[i] if i < len(hosts) else ""
        addr = addrs[i] if i < len(addrs) else ""
        if addr:
            tcp.append(name or addr)
        elif name and not name.startswith(("/", "@")):
            tcp.append(name)
    return tcp
