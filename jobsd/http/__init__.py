"""jobsd's HTTP API (FastAPI): submit and follow jobs, per-org access, health and metrics.

Run it alone (``jobsd api``), inside the daemon (``JOBSD_HTTP_ADDR``), or mount the
jobs endpoints in your own FastAPI app::

    from fastapi import FastAPI
    import jobsd.http

    app = FastAPI()
    app.include_router(jobsd.http.router(org_dependency=current_org), prefix="/api")

Importing this package is cheap: FastAPI and uvicorn load on first use, so a daemon
without ``JOBSD_HTTP_ADDR`` never loads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jobsd.http.protocols import DaemonView
from jobsd.http.settings import HttpSettings

if TYPE_CHECKING:
    from anyio.abc import TaskStatus
    from fastapi import APIRouter, FastAPI

    from jobsd.settings import Settings

__all__ = ["DaemonView", "HttpSettings", "create_app", "router", "serve"]


def create_app(
    settings: Settings | None = None,
    http: HttpSettings | None = None,
    *,
    daemon: DaemonView | None = None,
) -> FastAPI:
    """Build jobsd's FastAPI app (jobs with bearer tokens, health, metrics)."""
    from jobsd.http.app import create_app as build

    return build(settings, http, daemon=daemon)


def router(
    *,
    org_dependency: Callable[..., Any],
    settings: Settings | None = None,
    http: HttpSettings | None = None,
) -> APIRouter:
    """Return the jobs endpoints for a host app; ``org_dependency`` returns the caller's org."""
    from jobsd.http.app import router as build

    return build(org_dependency=org_dependency, settings=settings, http=http)


async def serve(
    settings: Settings | None = None,
    http: HttpSettings | None = None,
    *,
    daemon: DaemonView | None = None,
    task_status: TaskStatus[tuple[str, int]] | None = None,
) -> None:
    """Serve the API on ``JOBSD_HTTP_ADDR`` in the running event loop until cancelled.

    For the daemon's task group: ``await tg.start(partial(serve, settings, daemon=self))``
    returns the bound ``(host, port)``.
    """
    import anyio

    from jobsd.http.server import serve as run

    await run(settings, http, daemon=daemon, task_status=task_status or anyio.TASK_STATUS_IGNORED)
