"""The dashboard at /ui: overview, jobs, one job, and operator actions (docs/ui.md).

Served by jobsd's own API app (``jobsd api``, ``JOBSD_HTTP_ADDR``) unless
``JOBSD_UI=false``. Loaded only then: Jinja2 is imported by the pages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from jobsd.http.backend import ApiBackend

__all__ = ["mount_ui"]


def mount_ui(app: FastAPI, backend: ApiBackend) -> None:
    """Add the /ui pages and their static files to ``app``."""
    from jobsd.http.ui.pages import ui_router
    from jobsd.http.ui.web import mount_static

    app.include_router(ui_router(backend))
    mount_static(app)
