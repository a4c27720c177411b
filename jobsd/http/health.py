"""Liveness, readiness and the health report. No token: bind the address you trust.

- ``/healthz``: the process answers and its event loop is not stalled.
- ``/readyz``: the database answers, this API's LISTEN connection is up, and so is the
  attached daemon's (when it listens). 503 otherwise.
- ``/health``: figures that go bad before the jobs table does (pickup lag, dead
  tuples, an old open transaction holding back vacuum, time since the last
  notification), with warnings against thresholds from settings; queued jobs that no
  live daemon handles, naming at most ``UNHANDLED_TYPE_NAMES`` types.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from fastapi import APIRouter, Response
from pydantic import BaseModel

from jobsd.errors import BackendUnavailable, DatabaseError
from jobsd.http.backend import ApiBackend
from jobsd.http.problems import endpoint_name
from jobsd.http.schemas import HealthReport, Liveness, Readiness
from jobsd.http.settings import HttpSettings
from jobsd.store import api

__all__ = ["STALL_S", "health_router"]

_Endpoint = TypeVar("_Endpoint", bound=Callable[..., Any])

# a loop that has not ticked for this long is stalled
STALL_S = 5.0
# /health names at most this many unhandled types, the most queued; the others are
# summed under OTHER_TYPE, so tenants' type names cannot grow the report
UNHANDLED_TYPE_NAMES = 20
OTHER_TYPE = "_other"
# the report's figures with a warning threshold in HttpSettings: (figure, setting,
# warning), the warning formatted with the figure's ``value`` and the setting's ``limit``
_THRESHOLDS = (
    (
        "oldest_queued_age_s",
        "health_pickup_lag_warn",
        "pickup lag: a queued job has waited {value:.0f} s (over {limit:g} s): too few "
        "slots, or no daemon for its queue",
    ),
    (
        "dead_tuples",
        "health_dead_tuples_warn",
        "jobsd.jobs holds {value} dead tuples (over {limit}): vacuum is falling behind",
    ),
    (
        "oldest_xact_age_s",
        "health_xact_age_warn",
        "a transaction has been open {value:.0f} s (over {limit:g} s): it holds back "
        "vacuum of the jobs table",
    ),
    (
        "oldest_prepared_xact_age_s",
        "health_xact_age_warn",
        "a prepared transaction has been open {value:.0f} s (over {limit:g} s): it holds "
        "back vacuum of the jobs table",
    ),
    (
        "notify_queue_usage",
        "health_notify_queue_warn",
        "the NOTIFY queue is {value:.0%} full (over {limit:.0%}): a session that LISTENs "
        "is stuck in a transaction; at 100 % enqueues fail",
    ),
)


def health_router(backend: ApiBackend) -> APIRouter:
    """Build /healthz, /readyz and /health on ``backend``."""
    router = APIRouter(tags=["health"], generate_unique_id_function=endpoint_name)

    def probe(
        path: str, model: type[BaseModel], summary: str, unavailable: str
    ) -> Callable[[_Endpoint], _Endpoint]:
        """Declare ``GET path``: ``model``, also with 503 (``unavailable`` says when)."""

        def declare(endpoint: _Endpoint) -> _Endpoint:
            return router.get(
                path,
                response_model=model,
                responses={503: {"model": model, "description": unavailable}},
                summary=summary,
            )(endpoint)

        return declare

    @probe(
        "/healthz",
        Liveness,
        "Liveness: the process answers, its event loop is not stalled",
        "The event loop is stalled.",
    )
    async def healthz(response: Response) -> Liveness:
        age = backend.monitor.tick_age_s()
        stalled = age > STALL_S
        if stalled:
            response.status_code = 503
        return Liveness(
            status="stalled" if stalled else "ok",
            loop_lag_s=round(backend.monitor.worst_lag_s(), 4),
            last_tick_age_s=round(age, 4),
        )

    @probe(
        "/readyz",
        Readiness,
        "Readiness: database reachable, LISTEN connections up",
        "Not ready: see checks.",
    )
    async def readyz(response: Response) -> Readiness:
        checks = {
            "database": await _database_ok(backend),
            "listen": backend.started and backend.waiter.connected,
        }
        daemon = backend.daemon
        if daemon is not None and daemon.settings.notify:
            checks["daemon_listen"] = daemon.listener.connected
        if daemon is not None:
            checks["daemon_progress"] = daemon.making_progress()
        ready = all(checks.values())
        if not ready:
            response.status_code = 503
        return Readiness(status="ready" if ready else "unavailable", checks=checks)

    @probe(
        "/health",
        HealthReport,
        "Health report: early warnings about the jobs table and wake-ups",
        "The database is unavailable.",
    )
    async def health_report(response: Response) -> HealthReport:
        report = await build_report(backend)
        if report.status == "unavailable":
            response.status_code = 503
        return report

    return router


async def _database_ok(backend: ApiBackend) -> bool:
    if not backend.started:
        return False
    with anyio.move_on_after(backend.http.ready_timeout):
        try:
            # cached: a flood of probes asks the database once a second at most
            ok: bool = await backend.probes.get(
                "readiness", lambda: backend.probe_read("readiness check", api.ping)
            )
            return ok
        except (BackendUnavailable, DatabaseError):
            return False
    return False


@dataclass(frozen=True, slots=True)
class _Unhandled:
    """Queued jobs no live daemon handles: how many, and by type (bounded)."""

    jobs: int
    types: dict[str, int]
    """the UNHANDLED_TYPE_NAMES most queued types, the rest summed under OTHER_TYPE"""
    other_types: int
    """how many types were summed under OTHER_TYPE"""

    def describe(self) -> str:
        """Name the types for the warning: ``a (3), b (1) and 9 other types (12 jobs)``."""
        if not self.other_types:
            return ", ".join(f"{t} ({n})" for t, n in self.types.items())
        named = ", ".join(f"{t} ({n})" for t, n in self.types.items() if t != OTHER_TYPE)
        other = f"{self.other_types} other types ({self.types[OTHER_TYPE]} jobs)"
        return f"{named} and {other}" if named else other


async def _unhandled(backend: ApiBackend, timeout_s: float) -> _Unhandled:
    """Count the unhandled jobs on the probes' connection and bound them by type."""
    rows = await backend.probe_read("health report", api.unhandled_jobs, timeout_s=timeout_s)
    by_type: dict[str, int] = {}
    for _, type_, jobs in rows:
        by_type[type_] = by_type.get(type_, 0) + jobs
    ranked = sorted(by_type.items(), key=lambda item: (-item[1], item[0]))
    types = dict(ranked[:UNHANDLED_TYPE_NAMES])
    rest = ranked[UNHANDLED_TYPE_NAMES:]
    if rest:
        # a type a tenant named _other adds to the sum rather than hiding it
        types[OTHER_TYPE] = types.get(OTHER_TYPE, 0) + sum(n for _, n in rest)
    return _Unhandled(sum(by_type.values()), types, len(rest))


def threshold_warnings(report: HealthReport, http: HttpSettings) -> list[str]:
    """Return the warnings of the report's figures over their thresholds (_THRESHOLDS)."""
    return [
        text.format(value=value, limit=limit)
        for field, setting, text in _THRESHOLDS
        if (value := getattr(report, field)) is not None
        and value > (limit := getattr(http, setting))
    ]


def _age(monotonic: float | None) -> float | None:
    return round(time.monotonic() - monotonic, 3) if monotonic is not None else None


async def build_report(backend: ApiBackend) -> HealthReport:
    """Gather the health figures and the warnings they raise."""
    http = backend.http
    row: dict[str, object] = {}
    unhandled: _Unhandled | None = None
    database = False
    if backend.started:
        with anyio.move_on_after(http.ready_timeout + 1):
            try:
                row = await backend.probes.get(
                    "health",
                    lambda: backend.probe_read(
                        "health report", api.health_row, timeout_s=http.ready_timeout
                    ),
                )
                try:
                    unhandled = await backend.probes.get(
                        "unhandled", lambda: _unhandled(backend, http.ready_timeout)
                    )
                except BackendUnavailable:
                    raise
                except DatabaseError:
                    unhandled = None  # e.g. a role without EXECUTE (migration 0019)
                database = True
            except (BackendUnavailable, DatabaseError):
                database = False
    daemon = backend.daemon
    waiter_connected = backend.started and backend.waiter.connected
    report = HealthReport.model_validate(
        {
            "status": "ok",
            "warnings": [],
            "database": database,
            "oldest_queued_age_s": row.get("oldest_queued_age_s"),
            "live_tuples": row.get("live_tuples"),
            "dead_tuples": row.get("dead_tuples"),
            "last_vacuum_at": row.get("last_vacuum_at"),
            "oldest_xact_age_s": row.get("oldest_xact_age_s"),
            "oldest_prepared_xact_age_s": row.get("oldest_prepared_xact_age_s"),
            "notify_queue_usage": row.get("notify_queue_usage"),
            "last_notify_age_s": _age(daemon.stats.last_notify_monotonic) if daemon else None,
            "last_done_notify_age_s": (
                _age(backend.waiter.last_notify_monotonic) if backend.started else None
            ),
            "listen_connected": waiter_connected,
            "unhandled_jobs": unhandled.jobs if unhandled is not None else None,
            "unhandled_types": unhandled.types if unhandled is not None else {},
            "oldest_running_age_s": row.get("oldest_running_age_s"),
            "oldest_running_idle_s": row.get("oldest_running_idle_s"),
            "recovery_required": row.get("recovery_required"),
            "slots": daemon.holdings.slots if daemon else None,
            "slots_busy": daemon.holdings.running if daemon else None,
        }
    )
    warnings = report.warnings
    if not database:
        warnings.append("database unavailable: no figures")
        report.status = "unavailable"
        return report
    warnings.extend(threshold_warnings(report, http))
    if unhandled is None:
        warnings.append(
            "queued jobs of types no live daemon handles could not be counted: this API's "
            "database role may lack EXECUTE on jobsd.unhandled_jobs() "
            "(`jobsd roles create` grants it)"
        )
    elif unhandled.jobs:
        warnings.append(
            f"{unhandled.jobs} queued jobs are of types no live daemon handles: "
            f"{unhandled.describe()}; start a daemon with their handlers (JOBSD_HANDLERS)"
        )
    backlog = report.recovery_required
    if backlog:
        warnings.append(
            f"{backlog} job(s) are recovery_required: their outcome is unknown, "
            "an operator resolves them (jobsd resolve)"
        )
    if not waiter_connected:
        warnings.append("this API's LISTEN connection is down: long-polls end at their deadline")
    if daemon is not None and daemon.settings.notify and not daemon.listener.connected:
        warnings.append("the daemon's LISTEN connection is down: pickup falls back to polling")
    if warnings:
        report.status = "warn"
    return report
