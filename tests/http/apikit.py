"""Helpers of the HTTP tests: an API in-process or on a loopback socket, tokens, daemons."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import anyio
import httpx
import psycopg
from fastapi import FastAPI
from support.daemon import DAEMON_FAST as DAEMON_FAST
from support.daemon import fast_settings
from support.daemon import running_daemon as running_daemon
from support.waiting import wait_until as wait_until

from jobsd.http.app import create_app
from jobsd.http.backend import ApiBackend
from jobsd.http.protocols import DaemonView
from jobsd.http.server import serve
from jobsd.http.settings import HttpSettings
from jobsd.ops import Caller
from jobsd.ops.tokens import create_token
from jobsd.settings import Settings

OPERATOR = Caller.as_operator("tests")

T = TypeVar("T")

# core settings for a database URL, with short intervals
settings_for = fast_settings


def http_settings(**overrides: Any) -> HttpSettings:
    """Return API settings with a short long-poll cap (tests never wait 30 s) and no
    token or probe cache (a revoked token is refused at once, a probe reads now)."""
    values: dict[str, Any] = {
        "http_addr": "127.0.0.1:0",
        "longpoll_max": 5.0,
        "token_cache_s": 0.0,
        "probe_cache_s": 0.0,
    }
    return HttpSettings(**{**values, **overrides})


def make_token(db_url: str, org_id: str, name: str | None = None) -> str:
    """Create a bearer token for ``org_id`` and return it."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        token, _ = create_token(conn, OPERATOR, org_id, name)
    return token


async def ui_login(client: httpx.AsyncClient, token: str) -> str:
    """Log in to the dashboard; return the CSRF token of the overview."""
    answer = await client.post("/ui/login", data={"token": token})
    assert answer.status_code == 303, answer.text
    page = await client.get("/ui")
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, "no CSRF field on the page"
    return found.group(1)


def bearer(token: str) -> dict[str, str]:
    """Return the Authorization header of ``token``."""
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Api:
    """An API under test and a client to call it."""

    app: FastAPI
    backend: ApiBackend
    client: httpx.AsyncClient

    async def until_listening(self, timeout_s: float = 10.0) -> None:
        """Wait until the API's LISTEN connection is up."""
        await wait_until(
            lambda: _true_if(self.backend.started and self.backend.waiter.connected),
            what="the API's LISTEN connection",
            timeout_s=timeout_s,
        )


async def _true_if(value: bool) -> bool:
    return value


@asynccontextmanager
async def running_api(
    settings: Settings,
    http: HttpSettings | None = None,
    *,
    daemon: DaemonView | None = None,
) -> AsyncIterator[Api]:
    """Run the app's lifespan in this loop and call it in-process (httpx ASGI transport)."""
    app = create_app(settings, http or http_settings(), daemon=daemon)
    backend: ApiBackend = app.state.jobsd
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
            yield Api(app, backend, client)


@asynccontextmanager
async def served_api(
    settings: Settings,
    http: HttpSettings | None = None,
    *,
    daemon: DaemonView | None = None,
) -> AsyncIterator[tuple[str, ApiBackend]]:
    """Serve the API with uvicorn on a free loopback port; yield its base URL."""
    app = create_app(settings, http or http_settings(), daemon=daemon)
    async with anyio.create_task_group() as tg:
        host, port = await tg.start(
            partial(serve, settings, http or http_settings(), daemon=daemon, app=app)
        )
        try:
            yield f"http://{host}:{port}", app.state.jobsd
        finally:
            tg.cancel_scope.cancel()


def db_scalar(db_url: str, query: str, *params: Any) -> Any:
    """Run one query and return the first column of its first row (None if no row)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(query, params or None).fetchone()
    return row[0] if row else None
