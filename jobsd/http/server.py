"""Serve the API with uvicorn inside the caller's event loop, as one task.

The daemon's supervisor starts ``serve`` in its task group when ``JOBSD_HTTP_ADDR`` is
set; ``jobsd api`` runs it alone. uvicorn does not touch signal handlers here: the
owner of the loop decides when to stop, by cancelling the task. Stopping answers
every long-poll at once (with the current state), lets open requests finish for up
to ``JOBSD_HTTP_SHUTDOWN_GRACE``, then closes the connections.

Connections pass ``jobsd.http.guard`` first: a cap per peer at accept, deadlines for
request headers and bodies, and the request slots, which the probes go around.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
from collections.abc import Iterator

import anyio
import uvicorn
from anyio.abc import TaskStatus
from fastapi import FastAPI

from jobsd.errors import ConfigError
from jobsd.http.app import create_app
from jobsd.http.backend import ApiBackend
from jobsd.http.guard import ConnectionGuard, Slots, guarded_protocol
from jobsd.http.protocols import DaemonView
from jobsd.http.settings import HttpSettings, parse_addr
from jobsd.settings import Settings

__all__ = ["run_api", "serve"]

log = logging.getLogger(__name__)


class _NoColor(logging.Filter):
    """Drop uvicorn's ``color_message`` extra: jobsd's log lines carry their extras."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.pop("color_message", None)
        return True


def _quiet_uvicorn() -> None:
    uv_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _NoColor) for f in uv_log.filters):
        uv_log.addFilter(_NoColor())


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the loop's owner stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    """Listen on ``host:port``; accepted connections get TCP_NODELAY.

    asyncio sets TCP_NODELAY only on sockets whose ``proto`` is IPPROTO_TCP, and an
    accepted socket inherits ``proto`` from the listening one: made with proto 0 (as
    ``socket.create_server`` does), every keep-alive response waited ~40 ms for the
    client's delayed ACK (uvicorn writes headers and body separately).
    """
    infos = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )
    family, type_, proto, _, address = infos[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.setblocking(False)
    return sock


async def serve(
    settings: Settings | None = None,
    http: HttpSettings | None = None,
    *,
    daemon: DaemonView | None = None,
    app: FastAPI | None = None,
    task_status: TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API on ``JOBSD_HTTP_ADDR`` until cancelled.

    Reports ``(host, port)`` as started once the socket listens and the app's lifespan
    has run (port 0 in the address picks a free port). The API comes up even while
    the database is down; it answers 503 until it is back.
    """
    settings = settings or Settings()
    http = http or HttpSettings()
    if not http.http_addr:
        raise ConfigError("no address to serve on: set JOBSD_HTTP_ADDR (e.g. 127.0.0.1:8080)")
    if not (http.api_database_url or settings.database_url):
        raise ConfigError("no database configured: set JOBSD_DATABASE_URL")
    host, port = parse_addr(http.http_addr)
    app = app or create_app(settings, http, daemon=daemon)
    backend: ApiBackend = app.state.jobsd
    sock = _bind(host, port)
    bound = sock.getsockname()[:2]
    guard = ConnectionGuard(
        per_peer=http.http_max_connections_per_peer,
        header_timeout_s=http.http_header_timeout,
        body_timeout_s=http.http_body_timeout,
    )
    config = uvicorn.Config(
        # beyond this many requests at once, 503 at once (not uvicorn's limit_concurrency:
        # it counts every open socket, the ones that never sent a request too)
        Slots(app, http.http_max_concurrency),
        # h11 under the per-peer cap and the header and body deadlines (jobsd.http.guard)
        http=guarded_protocol(guard),
        lifespan="on",
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=int(max(http.http_shutdown_grace, 1)),
        ws="none",
    )
    _quiet_uvicorn()
    server = _Server(config)
    done = anyio.Event()
    # uvicorn stops when asked (should_exit), not when cancelled from outside
    server_scope = anyio.CancelScope(shield=True)

    async def run_server() -> None:
        try:
            with server_scope:
                await server.serve(sockets=[sock])
        except SystemExit:  # uvicorn's answer to a failed lifespan startup
            log.error("api.startup_failed")
        finally:
            done.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_server, name="jobsd-api")
            try:
                with anyio.CancelScope() as wait_scope:
                    tg.start_soon(_cancel_when_set, done, wait_scope)
                    await backend.wait_started()
                if done.is_set():
                    if isinstance(backend.startup_error, ConfigError):
                        raise backend.startup_error
                    raise ConfigError("the HTTP API stopped during startup (see the log)")
                shown = f"[{bound[0]}]" if ":" in str(bound[0]) else str(bound[0])
                log.info("api.listening", extra={"addr": f"{shown}:{bound[1]}"})
                task_status.started((str(bound[0]), int(bound[1])))
                await done.wait()
            finally:
                with anyio.CancelScope(shield=True):
                    await _stop(server, server_scope, backend, done, http.http_shutdown_grace)
    finally:
        sock.close()


async def _stop(
    server: uvicorn.Server,
    scope: anyio.CancelScope,
    backend: ApiBackend,
    done: anyio.Event,
    grace_s: float,
) -> None:
    """Stop uvicorn: answer long-polls, let requests finish, then force it."""
    backend.close_waits()
    server.should_exit = True
    with anyio.move_on_after(grace_s + 2):
        await done.wait()
    if not done.is_set():
        log.warning("api.forced_stop")
        server.force_exit = True
        scope.cancel()
        await done.wait()


async def _cancel_when_set(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def run_api(settings: Settings, http: HttpSettings) -> None:
    """Serve the API alone (``jobsd api``) until SIGTERM or SIGINT."""

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                await tg.start(lambda task_status: serve(settings, http, task_status=task_status))
                async for signum in signals:
                    log.info("api.signal", extra={"signal": signal.Signals(signum).name})
                    tg.cancel_scope.cancel()
                    break

    anyio.run(main)
