"""jobsd.http.router(org_dependency=...) in a host FastAPI app (seed 000's CurrentOrgDep)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

import httpx
import pytest
from apikit import db_scalar, http_settings, settings_for
from fastapi import Depends, FastAPI, Header, HTTPException

import jobsd.http

pytestmark = pytest.mark.anyio


def current_org(x_org: Annotated[str | None, Header()] = None) -> str:
    """The host's own authentication: here, a header its gateway sets."""
    if not x_org:
        raise HTTPException(status_code=401, detail="who are you?")
    return x_org


CurrentOrgDep = Annotated[str, Depends(current_org)]


def host_app(db_url: str, events: list[str]) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        events.append("host started")
        yield
        events.append("host stopped")

    app = FastAPI(lifespan=lifespan)

    @app.get("/whoami")
    async def whoami(org: CurrentOrgDep) -> dict[str, str]:
        return {"org": org}

    app.include_router(
        jobsd.http.router(
            org_dependency=current_org, settings=settings_for(db_url), http=http_settings()
        ),
        prefix="/api",
    )
    return app


async def test_the_router_runs_in_a_host_app_with_its_org_dependency(db_url: str) -> None:
    events: list[str] = []
    app = host_app(db_url, events)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://host") as client:
            assert (await client.get("/whoami", headers={"X-Org": "acme"})).json() == {
                "org": "acme"
            }
            r = await client.post("/api/jobs", json={"type": "t"}, headers={"X-Org": "acme"})
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            assert r.json()["org_id"] == "acme"
            assert r.headers["location"] == f"http://host/api/jobs/{job_id}"
            r = await client.get(f"/api/jobs/{job_id}?wait=0.1", headers={"X-Org": "acme"})
            assert r.status_code == 200 and r.json()["status"] == "queued"
            r = await client.get(f"/api/jobs/{job_id}", headers={"X-Org": "globex"})
            assert r.status_code == 404
            r = await client.post("/api/jobs", json={"type": "t"})
            assert r.status_code == 401 and r.json() == {"detail": "who are you?"}
            # jobsd's own probes and tokens are not part of the router
            assert (await client.get("/api/healthz")).status_code == 404
    assert events == ["host started", "host stopped"]
    assert db_scalar(db_url, "SELECT count(*) FROM jobsd.jobs") == 1


async def test_the_router_without_its_lifespan_answers_503_not_500(db_url: str) -> None:
    """Mounting without include_router's lifespan merge (e.g. a bare Starlette mount)."""
    app = FastAPI()
    router = jobsd.http.router(org_dependency=lambda: "acme", settings=settings_for(db_url))
    app.router.routes.extend(router.routes)  # bypasses include_router: no lifespan
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://host") as client:
        r = await client.post("/jobs", json={"type": "t"})
    assert r.status_code == 503
    assert r.json()["detail"]["code"] == "not_started"
