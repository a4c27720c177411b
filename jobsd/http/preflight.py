"""Refuse, before anything starts, what the HTTP API would refuse once it runs.

``jobsd api``, and ``jobsd run`` when ``JOBSD_HTTP_ADDR`` is set, call ``check_api``
after reading their settings and before they open a pool, register a daemon or start
a handler process: a refusal is one ConfigError naming the setting, the command's
only line (``jobsd: error: ...``), not a traceback from the API's startup once the
daemon runs. No connection is opened here: what only the database can answer (does
the API's role bypass row-level security?) is still checked at the API's startup.

The TLS policy is the store's (``jobsd.cli.common.check_url`` opens the door to it):
the caller passes it in (``check_url=``), so this module does not reach into the store.
"""

from __future__ import annotations

import errno
import re
import socket
from collections.abc import Callable

from jobsd.errors import ConfigError
from jobsd.http.settings import HttpSettings, parse_addr
from jobsd.settings import Settings

__all__ = ["UrlCheck", "check_addr", "check_api"]

UrlCheck = Callable[[str], object]
"""Apply the TLS policy to a URL: raise ConfigError when it refuses it."""

_ADDR_SETTING = "JOBSD_HTTP_ADDR"
_API_URL_SETTING = "JOBSD_API_DATABASE_URL"
_BIND_HINTS = {
    errno.EADDRINUSE: "stop what listens there, or choose another port",
    errno.EACCES: "ports below 1024 need privileges: choose another port",
    errno.EADDRNOTAVAIL: "not an address of this machine: use one of its own, or 0.0.0.0",
}


def check_api(settings: Settings, http: HttpSettings, *, check_url: UrlCheck) -> None:
    """Raise ConfigError, naming the setting, when the API could not start: no address, one
    it cannot listen on, no database URL, or one the TLS policy refuses."""
    if not http.http_addr:
        raise ConfigError(f"no address to serve on: set {_ADDR_SETTING} (e.g. 127.0.0.1:8080)")
    if http.api_database_url:
        try:
            check_url(http.api_database_url)
        except ConfigError as exc:
            # the policy's advice speaks of the daemon's URL; this one is the API's
            advice = re.sub(r"\bJOBSD_DATABASE_URL\b", _API_URL_SETTING, str(exc))
            raise ConfigError(f"invalid setting {_API_URL_SETTING}: {advice}") from exc
    elif settings.database_url:
        check_url(settings.database_url)  # its message names JOBSD_DATABASE_URL already
    else:
        raise ConfigError("no database configured: set JOBSD_DATABASE_URL")
    check_addr(http.http_addr)


def check_addr(addr: str) -> None:
    """Raise ConfigError unless the API can listen on ``addr`` now.

    Its host must resolve to an address of this machine and its port be free (port 0
    picks one when the API starts). A trial bind and listen, as the API does them, closed
    at once: the API binds again a moment later (a port taken in between still fails
    there, as before).
    """
    try:
        host, port = parse_addr(addr)
    except ValueError as exc:
        raise ConfigError(f"invalid setting {_ADDR_SETTING}: {exc}") from None
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ConfigError(
            f"invalid setting {_ADDR_SETTING}: cannot resolve host {host!r} of {shown} "
            f"({reason}): use an address of this machine, e.g. 127.0.0.1:8080 or 0.0.0.0:8080"
        ) from None
    family, type_, proto, _, address = infos[0]
    with socket.socket(family, type_, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
            sock.listen(1)
        except OSError as exc:
            hint = _BIND_HINTS.get(exc.errno or 0)
            raise ConfigError(
                f"invalid setting {_ADDR_SETTING}: cannot listen on {shown}: "
                f"{exc.strerror or exc}" + (f"; {hint}" if hint else "")
            ) from None
