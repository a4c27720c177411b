"""Build jobsd's FastAPI app, or just its jobs router for a host application."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from jobsd.http.auth import bearer_admin, bearer_caller, caller_of_org
from jobsd.http.backend import ApiBackend
from jobsd.http.bodylimit import BodyLimitMiddleware
from jobsd.http.bulk_routes import bulk_router
from jobsd.http.health import health_router
from jobsd.http.metrics import RequestMetrics, metrics_router, request_counter
from jobsd.http.probes import ProbeGuard
from jobsd.http.problems import http_error_handler, responses, validation_error_handler
from jobsd.http.protocols import DaemonView
from jobsd.http.queue_routes import queues_router
from jobsd.http.routes import jobs_router
from jobsd.http.schedule_routes import schedules_router
from jobsd.http.settings import HttpSettings
from jobsd.settings import Settings

__all__ = ["create_app", "router"]

_DESCRIPTION = """\
Submit jobs to jobsd, follow them, list and cancel them.

Every `/jobs` endpoint needs a bearer token (`jobsd token create --org ORG`); the token
decides the org, and a job of another org is not found. `/queues` needs an admin token
(`jobsd token create --org ORG --admin`): queues are shared by every org. `/healthz`,
`/readyz`, `/health` and `/metrics` need no token.
"""


def _version() -> str:
    try:
        return importlib.metadata.version("jobsd")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
        return "0+unknown"


def create_app(
    settings: Settings | None = None,
    http: HttpSettings | None = None,
    *,
    daemon: DaemonView | None = None,
) -> FastAPI:
    """Build the API: jobs (bearer tokens), health and metrics.

    Nothing connects until the app's lifespan starts; building it needs no database
    (the OpenAPI schema is generated this way). With ``daemon``, readiness, health and
    metrics include that daemon's state.
    """
    backend = ApiBackend(settings, http, daemon=daemon)
    registry = CollectorRegistry()
    app = FastAPI(
        title="jobsd",
        version=_version(),
        description=_DESCRIPTION,
        lifespan=backend.lifespan,
        openapi_tags=[
            {"name": "jobs", "description": "Jobs of the caller's org."},
            {"name": "queues", "description": "Queue administration (admin tokens only)."},
            {"name": "schedules", "description": "Periodic jobs (admin tokens only)."},
            {
                "name": "health",
                "description": "Probes (no token); health report and metrics (the probe "
                "token, JOBSD_PROBE_TOKEN).",
            },
        ],
    )
    app.state.jobsd = backend
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.include_router(
        jobs_router(backend, bearer_caller(backend), with_lifespan=False), responses=responses(401)
    )
    app.include_router(bulk_router(backend, bearer_caller(backend)), responses=responses(401))
    app.include_router(queues_router(backend, bearer_admin(backend)), responses=responses(401))
    app.include_router(schedules_router(backend, bearer_admin(backend)), responses=responses(401))
    app.include_router(health_router(backend))
    app.include_router(metrics_router(backend, registry))
    if backend.http.ui:
        from jobsd.http.ui import mount_ui

        mount_ui(app, backend)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=backend.body_limit)
    app.add_middleware(ProbeGuard, token=backend.http.probe_token)
    app.add_middleware(RequestMetrics, counter=request_counter(registry))
    return app


def router(
    *,
    org_dependency: Callable[..., Any],
    settings: Settings | None = None,
    http: HttpSettings | None = None,
) -> APIRouter:
    """Return the jobs endpoints for a host FastAPI app that already knows the caller's org.

    ``org_dependency`` is a FastAPI dependency returning the org id (a non-empty str);
    it does the authentication. The router carries its own lifespan, merged into the
    host app's by ``include_router``. Cap request bodies in the host app (FastAPI's
    ``max_body_size``, or ``jobsd.http.BodyLimitMiddleware``).
    """
    backend = ApiBackend(settings, http)
    jobs = jobs_router(backend, caller_of_org(org_dependency), with_lifespan=True)
    jobs.include_router(bulk_router(backend, caller_of_org(org_dependency)))
    return jobs
