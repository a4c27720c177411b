"""The schedules page: every periodic schedule, its cadence, next and last tick, and
its counters; an operator pauses and resumes one from it.

Schedules are shared by every org, so the page is an operator's, as ``GET /schedules``
is an admin token's: the reads and the changes are those of ``jobsd.ops.schedules``
(the CLI's ``jobsd schedule``), which refuse an org's caller (403 here). A pause or
resume is a POST that ``Ui.page`` has checked (session, origin, CSRF); it is
recorded as the CLI's is (the schedule's ``paused_at`` and ``resumed_at``) and logged
with the viewer's actor.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from jobsd.errors import JobsdError
from jobsd.http.ui.web import Ui, Viewer, headers
from jobsd.ops import AsyncConn, Caller
from jobsd.ops.schedules import list_schedules, pause_schedule, resume_schedule
from jobsd.periodic import ScheduleInfo

__all__ = ["ScheduleRow", "add_schedule_pages"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """One schedule of the page: its row of ``jobsd.schedule_info`` and its next tick
    (None while paused)."""

    info: ScheduleInfo
    next_tick: datetime | None

    @property
    def cadence(self) -> str:
        """Return the cron expression (with its zone, unless UTC) or ``every 30s``."""
        spec = self.info.schedule.spec
        if self.info.cron is not None and self.info.timezone not in ("UTC", "Etc/UTC"):
            return f"{spec} ({self.info.timezone})"
        return spec


def add_schedule_pages(router: APIRouter, ui: Ui) -> None:
    """Add ``/ui/schedules`` and its pause and resume actions to the /ui router."""

    async def schedules(request: Request, viewer: Viewer) -> Response:
        caller = viewer.caller
        try:
            served = await ui.backend.read_lagging(
                "listing of the schedules",
                lambda conn: list_schedules(conn, caller),
                fresh="done" in request.query_params,
            )
        except JobsdError as exc:
            return ui.refused(request, viewer, exc)
        now = datetime.now(UTC)
        rows = [ScheduleRow(info, info.next_tick(now)) for info in served.value]
        return ui.render(
            request,
            "schedules.html",
            viewer,
            title="Schedules",
            served=served,
            schedules=rows,
            flash=request.query_params.get("done"),
        )

    router.add_api_route("/schedules", ui.page(schedules), methods=["GET"])

    def action(
        verb: str, fn: Callable[[AsyncConn, Caller, str], Awaitable[ScheduleInfo]]
    ) -> Callable[[Request, Viewer], Awaitable[Response]]:
        async def act(request: Request, viewer: Viewer) -> Response:
            schedule_id = request.path_params["schedule_id"]
            caller = viewer.caller
            try:
                await ui.backend.read(
                    f"{verb} of schedule {schedule_id!r}", lambda c: fn(c, caller, schedule_id)
                )
            except JobsdError as exc:
                return ui.refused(request, viewer, exc)
            log.info(
                f"ui.schedule_{verb}", extra={"schedule_id": schedule_id, "actor": viewer.actor}
            )
            done = "paused" if verb == "pause" else "resumed"
            return RedirectResponse(
                "/ui/schedules?" + urlencode({"done": f"schedule {schedule_id} {done}"}),
                status_code=303,
                headers=headers(),
            )

        return act

    router.add_api_route(
        "/schedules/{schedule_id}/pause", ui.page(action("pause", pause_schedule)), methods=["POST"]
    )
    router.add_api_route(
        "/schedules/{schedule_id}/resume",
        ui.page(action("resume", resume_schedule)),
        methods=["POST"],
    )
