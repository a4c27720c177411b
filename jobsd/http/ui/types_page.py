"""The per-type pages: every job type that ended a job over the last day, and one type.

Each shows, over the last hour and the last day, how many jobs ended (succeeded,
failed, cancelled) and how many per minute or hour, the failure rate (failed / ended),
and the median and 95th percentile of the final run's duration, with a bar a minute
for the last hour. The figures are ``jobsd.ops.type_stats``'s, as the viewer may see
them: an org's token its org's, an operator every org's or, with ``?org=``, one org's.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response

from jobsd.http.schemas import check_job_filters
from jobsd.http.ui import views
from jobsd.http.ui.views import minute_bars
from jobsd.http.ui.web import Ui, Viewer
from jobsd.ops.type_stats import TypeStats, Window, read_type_stats

__all__ = ["add_type_pages", "duration", "percent", "rate"]

_NONE = "\N{EN DASH}"  # a figure of nothing: no job ended, none ran


def duration(seconds: float | None) -> str:
    """Say a run duration: ``0.4 ms``, ``850 ms``, ``2.5 s``, ``12 min``; a dash for None."""
    if seconds is None:
        return _NONE
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    return views.span(seconds)


def percent(share: float | None) -> str:
    """Say a share as a percentage: ``0 %``, ``0.4 %``, ``12 %``; a dash for None."""
    if share is None:
        return _NONE
    value = share * 100
    if value == 0 or value >= 10:
        return f"{value:.0f} %"
    return f"{value:.1f} %"


def rate(per: float) -> str:
    """Say a rate: ``0``, ``0.02``, ``1.5``, ``120``."""
    if per == 0:
        return "0"
    if per < 0.1:
        return f"{per:.2f}"
    if per < 10:
        return f"{per:.1f}"
    return f"{per:.0f}"


def _jobs_url(type: str, org: str | None, **more: str) -> str:
    """Return the jobs list filtered by ``type`` (and the page's org, and ``more``)."""
    query = {"type": type, **({"org": org} if org else {}), **more}
    return "/ui/jobs?" + urlencode(query)


def _type_url(type: str, org: str | None) -> str:
    return "/ui/types/" + quote(type, safe="") + ("?" + urlencode({"org": org}) if org else "")


def add_type_pages(router: APIRouter, ui: Ui) -> None:
    """Add ``/ui/types`` and ``/ui/types/{type}`` to the /ui router."""

    def context(found: list[TypeStats], org: str | None) -> dict[str, Any]:
        return {
            "org": org or "",
            "bars": {s.type: minute_bars(s.minutes) for s in found},
            "chart": views,
            "count": "{:,}".format,
            "duration": duration,
            "percent": percent,
            "rate": rate,
            "jobs_url": lambda type, **more: _jobs_url(type, org, **more),
            "type_url": lambda type: _type_url(type, org),
        }

    async def types_list(request: Request, viewer: Viewer) -> Response:
        try:
            org = check_job_filters(org_id=request.query_params.get("org")).org_id
        except ValueError as exc:
            return ui.error_page(request, viewer, 400, f"bad filter: {exc}")
        caller = viewer.caller
        served = await ui.backend.read_lagging(
            "figures by job type", lambda conn: read_type_stats(conn, caller, org_id=org)
        )
        return ui.render(
            request,
            "types.html",
            viewer,
            title="Job types",
            served=served,
            types=served.value,
            **context(served.value, org),
        )

    router.add_api_route("/types", ui.page(types_list), methods=["GET"])

    async def one_type(request: Request, viewer: Viewer) -> Response:
        name = request.path_params["type"]
        try:
            checked = check_job_filters(type=name, org_id=request.query_params.get("org"))
        except ValueError as exc:
            return ui.error_page(request, viewer, 400, f"bad type: {exc}")
        if checked.type is None:
            return ui.error_page(request, viewer, 404, "name a job type: /ui/types/{type}")
        caller, org = viewer.caller, checked.org_id
        served = await ui.backend.read_lagging(
            f"figures of job type {name!r}",
            lambda conn: read_type_stats(conn, caller, type=name, org_id=org),
        )
        found = served.value
        stats = found[0] if found else TypeStats(name)
        return ui.render(
            request,
            "type.html",
            viewer,
            title=f"Type {name}",
            served=served,
            t=stats,
            windows=[("Last hour", stats.hour, "min"), ("Last day", stats.day, "h")],
            per=_per,
            **context([stats], org),
        )

    router.add_api_route("/types/{type:path}", ui.page(one_type), methods=["GET"])


def _per(window: Window, unit: str) -> float:
    """Return a window's jobs ended per ``unit`` (``min`` or ``h``)."""
    return window.per_minute if unit == "min" else window.per_hour
