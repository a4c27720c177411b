"""The dashboard's bulk actions: "Retry all N matching", "Cancel all N matching",
"Resolve all N matching as ...", offered on the jobs page when its filter's state is one
an action applies to.

The jobs page counts the jobs (a dry run of ``jobsd.ops.bulk``, as the viewer's caller)
and shows a form that carries the page's filter and the CSRF token; the browser asks
for a confirmation (``data-confirm``, static/ui.js) before sending it. The POST runs
the action on at most ``MAX_LIMIT`` jobs, oldest first, and answers a page with its
summary. An org's session acts on its own org's jobs only, whatever the form says; the
org filter is an operator's. A bulk retry counts against the token's submission rate
as one submission per job it may retry, as through the API.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, assert_never
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response

from jobsd.errors import DatabaseError
from jobsd.http.schemas import check_job_filters
from jobsd.http.ui.views import JobFilter, parse_time
from jobsd.http.ui.web import Ui, Viewer
from jobsd.models import JobStatus
from jobsd.ops import AsyncConn, Caller
from jobsd.ops.bulk import (
    ACTION_STATES,
    MAX_LIMIT,
    REFUSALS,
    BulkAction,
    BulkOptions,
    BulkOutcome,
    cancel_many,
    resolve_many,
    retry_many,
)

__all__ = ["BulkOffer", "add_bulk", "bulk_offer"]

log = logging.getLogger(__name__)

# the page's filter fields, as its query names them
FIELDS = ("status", "type", "queue", "org", "since", "until")

Run = Callable[[AsyncConn, Caller, BulkOptions], Awaitable[BulkOutcome]]


@dataclass(frozen=True, slots=True)
class BulkOffer:
    """The bulk action the jobs page offers for its filter: ``count`` jobs it would
    take (at most ``MAX_LIMIT``) of ``matching``; ``fields`` is the page's filter."""

    action: BulkAction
    count: int
    matching: int
    fields: dict[str, str]

    @property
    def label(self) -> str:
        """Return the button's text: ``Retry all 2000 matching``."""
        verb = str(self.action).capitalize()
        if self.matching > self.count:
            return f"{verb} the oldest {self.count} of {self.matching} matching"
        return f"{verb} all {self.count} matching"

    @property
    def question(self) -> str:
        """Return the confirmation the browser asks."""
        match self.action:
            case BulkAction.RETRY:
                what = "Each is retried as a new job; the queues' capacity may refuse some."
            case BulkAction.CANCEL:
                what = "Running ones get a cancel request: their handlers are stopped."
            case BulkAction.RESOLVE:
                what = "Each is settled as you chose; recorded in its history."
            case _:
                assert_never(self.action)
        return f"{self.action.capitalize()} {self.count} jobs? {what}"


def _action_of(status: JobStatus | None) -> BulkAction | None:
    """Return the action a list of jobs in ``status`` offers (None: none)."""
    if status is None:
        return None
    for action, states in ACTION_STATES.items():
        if status in states:
            return action
    return None


def _options(filters: JobFilter, *, dry_run: bool, limit: int = MAX_LIMIT) -> BulkOptions:
    return {
        "status": filters.status,
        "type": filters.type,
        "queue": filters.queue,
        "org_id": filters.org_id,
        "since": filters.since,
        "until": filters.until,
        "limit": limit,
        "dry_run": dry_run,
    }


def _run(action: BulkAction, form: dict[str, str]) -> Run:
    """Return the operation of ``action`` with the form's own choices."""
    match action:
        case BulkAction.RETRY:
            force = form.get("force") == "yes"
            return lambda conn, caller, o: retry_many(conn, caller, force=force, **o)
        case BulkAction.CANCEL:
            reason = "cancelled from the dashboard (bulk)"
            return lambda conn, caller, o: cancel_many(conn, caller, reason=reason, **o)
        case BulkAction.RESOLVE:
            how = form.get("outcome", "")
            return lambda conn, caller, o: resolve_many(conn, caller, how, **o)
        case _:
            assert_never(action)


async def bulk_offer(
    ui: Ui, viewer: Viewer, filters: JobFilter, query: dict[str, str]
) -> BulkOffer | None:
    """Return the bulk action the jobs page offers for ``filters`` (None: its state
    has none), with its count from a dry run; ``query`` is the page's filter as given."""
    action = _action_of(filters.status)
    if action is None:
        return None
    caller = viewer.caller
    run = _run(action, {"outcome": "succeeded"})  # how a resolve settles does not count
    try:  # on the primary, which acts: a page read on the replica shows no offer without it
        counted = await ui.backend.read(
            f"count of the jobs of a bulk {action}",
            lambda conn: run(conn, caller, _options(filters, dry_run=True)),
        )
    except (DatabaseError, ValueError) as exc:
        log.warning("ui.bulk_offer_unavailable", extra={"action": str(action), "error": str(exc)})
        return None
    if counted.matched == 0:
        return None
    fields = {k: query[k] for k in FIELDS if query.get(k)}
    return BulkOffer(action, counted.matched, counted.remaining, fields)


def _filter_of(form: dict[str, str]) -> JobFilter:
    """Read the form's filter as the jobs page reads its query (ValueError when bad)."""
    checked = check_job_filters(
        status=form.get("status"),
        type=form.get("type"),
        queue=form.get("queue"),
        org_id=form.get("org"),
    )
    chosen: dict[str, Any] = checked.model_dump(exclude={"cursor"})
    return JobFilter(
        **chosen,
        since=parse_time(form.get("since")),
        until=parse_time(form.get("until")),
    )


def add_bulk(router: APIRouter, ui: Ui) -> None:
    """Add the bulk actions' POST routes (``/ui/bulk/{action}``) to the /ui router."""

    async def act(request: Request, viewer: Viewer) -> Response:
        try:
            action = BulkAction(request.path_params["action"])
        except ValueError:
            return ui.error_page(request, viewer, 404, "no such bulk action")
        form: dict[str, str] = request.state.form
        try:
            filters = _filter_of(form)
        except ValueError as exc:
            return ui.error_page(request, viewer, 400, f"bad filter: {exc}")
        if filters.status is None or filters.status not in ACTION_STATES[action]:
            states = ", ".join(str(s) for s in ACTION_STATES[action])
            return ui.error_page(
                request, viewer, 400, f"a bulk {action} takes jobs in a state of: {states}"
            )
        caller = viewer.caller
        run = _run(action, form)
        operation = f"bulk {action} of jobs"
        limit = MAX_LIMIT
        try:
            if action is BulkAction.RETRY and ui.backend.submit_limiter is not None:
                counted = await ui.backend.read(
                    operation, lambda conn: run(conn, caller, _options(filters, dry_run=True))
                )
                wanted = max(1, min(MAX_LIMIT, counted.matched))
                limit, wait_s = ui.backend.take_submissions(f"token:{viewer.grant.id}", wanted)
                if limit == 0:
                    return ui.error_page(
                        request,
                        viewer,
                        429,
                        f"too many submissions with this token: retry in {wait_s} s",
                    )
            outcome = await ui.backend.once(
                operation,
                lambda conn: run(conn, caller, _options(filters, dry_run=False, limit=limit)),
            )
        except ValueError as exc:
            return ui.error_page(request, viewer, 400, str(exc))
        log.info(
            f"ui.bulk_{action}",
            extra={"bulk_id": outcome.id, "actor": viewer.actor, "done": outcome.done},
        )
        back = {k: form[k] for k in FIELDS if form.get(k)}
        return ui.render(
            request,
            "bulk_done.html",
            viewer,
            title=f"Bulk {action}",
            outcome=outcome,
            refusals=[(REFUSALS.get(k, k), n) for k, n in outcome.refused.items()],
            back_url="/ui/jobs?" + urlencode(back),
        )

    router.add_api_route("/bulk/{action}", ui.page(act), methods=["POST"])
