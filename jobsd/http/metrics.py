"""Prometheus metrics: the attached daemon's counters, queue depth, and the API's own.

Each app has its own ``CollectorRegistry`` (never the global one), so several apps in
one process (tests, a host application) do not collide. Queue depth is read from the
database at scrape time, by one bounded query over partial indexes; daemon counters
are read from the daemon's memory. A daemon's counters are its own since it started:
with several daemons, sum them in Prometheus.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobsd.errors import BackendUnavailable, DatabaseError
from jobsd.http.backend import ApiBackend
from jobsd.http.problems import endpoint_name
from jobsd.http.protocols import RunTimesView
from jobsd.store import api, handlers, schedules

__all__ = ["JobsdCollector", "RequestMetrics", "metrics_router", "request_counter"]

log = logging.getLogger(__name__)

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class JobsdCollector(Collector):
    """Export daemon counters, queue depth and API state at each scrape."""

    def __init__(self, backend: ApiBackend) -> None:
        self.backend = backend
        self._depth: list[tuple[str, str, int]] | None = None
        self._ages: list[api.QueueAge] | None = None
        self._notify_usage: float | None = None
        self._ticks: list[tuple[str, dict[str, int]]] | None = None
        self._running: dict[str, Any] | None = None

    async def refresh(self) -> None:
        """Read queue depth from the database (call before generating the exposition)."""
        backend = self.backend
        self._depth = None
        self._ages = None
        self._notify_usage = None
        self._ticks = None
        self._running = None
        if not backend.started:
            return
        timeout_s = backend.http.ready_timeout
        self._depth = await self._probe(
            "queue depth", "metrics.depth_unavailable", api.queue_depth, timeout_s=timeout_s
        )
        if self._depth is None:
            return
        self._ages = await self._probe(
            "oldest queued age",
            "metrics.oldest_age_unavailable",
            api.queue_oldest_age,
            timeout_s=timeout_s,
        )
        self._notify_usage = await self._probe(
            "notify queue usage",
            "metrics.notify_usage_unavailable",
            api.notify_queue_usage,
            timeout_s=timeout_s,
        )
        self._running = await self._probe(
            "running health", "metrics.running_health_unavailable", handlers.running_health
        )
        try:
            infos = await backend.read("schedule counters", schedules.info)
        except (BackendUnavailable, DatabaseError) as exc:
            log.warning("metrics.schedules_unavailable", extra={"error": str(exc)})
            return
        self._ticks = [
            (i.id, {"fired": i.fired, "refused": i.refused, "late": i.late, "skipped": i.skipped})
            for i in infos
        ]

    async def _probe(
        self, name: str, event: str, read: Callable[..., Awaitable[Any]], **kwargs: Any
    ) -> Any:
        """Return ``read(conn, **kwargs)`` run on the probes' connection (cached by
        ``probes``), or None, logged as ``event``, when the database did not answer."""
        backend = self.backend
        try:
            return await backend.probes.get(name, lambda: backend.probe_read(name, read, **kwargs))
        except (BackendUnavailable, DatabaseError) as exc:
            log.warning(event, extra={"error": str(exc)})
            return None

    def collect(self) -> Iterable[Metric]:
        """Yield the metric families."""
        yield from self._api()
        if self._depth is not None:
            depth = GaugeMetricFamily(
                "jobsd_queue_depth",
                "Jobs queued, scheduled, running or recovery_required, by queue and state.",
                labels=["queue", "status"],
            )
            for queue, status, count in self._depth:
                depth.add_metric([queue, status], count)
            yield depth
        if self._ages is not None:
            yield from _ages(self._ages)
        if self._notify_usage is not None:
            yield GaugeMetricFamily(
                "jobsd_notification_queue_usage",
                "Share of the cluster's NOTIFY queue in use (0 to 1).",
                value=self._notify_usage,
            )
        if self._running is not None:
            yield GaugeMetricFamily(
                "jobsd_running_longest_silence_seconds",
                "The longest time a running job's handler has gone without reporting "
                "progress (since its start if it never has), every org's; 0 when none runs.",
                value=self._running.get("oldest_running_idle_s") or 0.0,
            )
        if self._ticks is not None:
            ticks = CounterMetricFamily(
                "jobsd_schedule_ticks",
                "Ticks of each periodic schedule, every daemon's, by outcome: fired, refused "
                "(enqueue refused), late (fired after being missed), skipped (missed, not fired).",
                labels=["schedule", "outcome"],
            )
            for schedule_id, counts in self._ticks:
                for outcome, count in counts.items():
                    ticks.add_metric([schedule_id, outcome], count)
            yield ticks
        yield GaugeMetricFamily(
            "jobsd_database_up",
            "1 if the queue-depth query of this scrape succeeded.",
            value=1 if self._depth is not None else 0,
        )
        yield from self._daemon()

    def _api(self) -> Iterable[Metric]:
        backend = self.backend
        if not backend.started:
            return
        waiter = backend.waiter
        yield GaugeMetricFamily(
            "jobsd_api_listen_connected",
            "1 if this API's LISTEN connection (finished jobs) is up.",
            value=int(waiter.connected),
        )
        yield GaugeMetricFamily(
            "jobsd_api_longpolls_waiting", "Requests waiting in ?wait=.", value=waiter.waiting
        )
        yield CounterMetricFamily(
            "jobsd_api_done_notifications",
            "Job-finished notifications received by this API.",
            value=waiter.notifications,
        )
        yield CounterMetricFamily(
            "jobsd_api_listen_reconnects",
            "Reconnections of this API's LISTEN connection.",
            value=waiter.reconnects,
        )

    def _daemon(self) -> Iterable[Metric]:
        daemon = self.backend.daemon
        if daemon is None:
            return
        stats = daemon.stats
        claimed = CounterMetricFamily(
            "jobsd_jobs_claimed", "Jobs claimed by this daemon, by type.", labels=["type"]
        )
        for type_, count in sorted(stats.claimed.items()):
            claimed.add_metric([type_], count)
        yield claimed
        finished = CounterMetricFamily(
            "jobsd_jobs_finished",
            "Outcomes written by this daemon, by type and status.",
            labels=["type", "status"],
        )
        for (type_, status), count in sorted(stats.finished.items()):
            finished.add_metric([type_, status], count)
        yield finished
        errors = CounterMetricFamily(
            "jobsd_job_errors",
            "Runs of this daemon that ended in an error (retried or not), by type and cause.",
            labels=["type", "cause"],
        )
        for (type_, cause), count in sorted(stats.errors.items()):
            errors.add_metric([type_, cause], count)
        yield errors
        yield CounterMetricFamily(
            "jobsd_outcomes_discarded",
            "Outcomes not written because the lease was lost.",
            value=stats.discarded,
        )
        yield CounterMetricFamily(
            "jobsd_claimed_ahead_given_back",
            "Jobs claimed ahead and given back unstarted: every slot stayed held by a run "
            "that lasted.",
            value=stats.given_back,
        )
        wakeups = CounterMetricFamily(
            "jobsd_wakeups", "Claimer wake-ups, by cause.", labels=["cause"]
        )
        for cause, count in sorted(stats.wakeups.items()):
            wakeups.add_metric([cause], count)
        yield wakeups
        yield CounterMetricFamily(
            "jobsd_listen_reconnects",
            "Reconnections of the daemon's LISTEN connection.",
            value=stats.reconnects,
        )
        swept = CounterMetricFamily(
            "jobsd_jobs_swept",
            "Jobs rescued by this daemon's sweeper, by new status.",
            labels=["status"],
        )
        for status, count in sorted(stats.swept.items()):
            swept.add_metric([status], count)
        yield swept
        yield CounterMetricFamily(
            "jobsd_jobs_archived",
            "Ended jobs this daemon moved from the hot table into the archive.",
            value=stats.archived,
        )
        yield CounterMetricFamily(
            "jobsd_archive_refused",
            "Moves into the archive the database refused (logged as archive.refused).",
            value=stats.archive_refused,
        )
        yield GaugeMetricFamily("jobsd_slots", "Slots of this daemon.", value=daemon.holdings.slots)
        yield GaugeMetricFamily(
            "jobsd_slots_busy", "Handlers running in this daemon.", value=daemon.holdings.running
        )
        yield GaugeMetricFamily(
            "jobsd_jobs_reserved",
            "Jobs this daemon reserved ahead of its free slots: queued, started when a slot frees.",
            value=daemon.holdings.waiting,
        )
        yield GaugeMetricFamily(
            "jobsd_listen_connected",
            "1 if the daemon's LISTEN connection is up.",
            value=int(daemon.listener.connected),
        )
        last = stats.last_notify_monotonic
        yield GaugeMetricFamily(
            "jobsd_seconds_since_last_notify",
            "Time since the daemon last received a NOTIFY (NaN: none yet).",
            value=(time.monotonic() - last) if last is not None else math.nan,
        )
        run_s = getattr(stats, "run_s", None)
        if isinstance(run_s, RunTimesView):
            yield _histogram(run_s)


def _ages(ages: Sequence[api.QueueAge]) -> Iterable[Metric]:
    oldest = GaugeMetricFamily(
        "jobsd_queue_oldest_age_seconds",
        "How long the oldest due job of each queue has waited to start (0: none waits), "
        "every org's, among the queue's next 1,000 in claim order.",
        labels=["queue"],
    )
    paused = GaugeMetricFamily(
        "jobsd_queue_paused",
        "1 if the queue is paused (its jobs wait on purpose).",
        labels=["queue"],
    )
    for age in ages:
        oldest.add_metric([age.queue], age.age_s)
        paused.add_metric([age.queue], int(age.paused))
    yield oldest
    yield paused


def _histogram(run_s: RunTimesView) -> Metric:
    family = HistogramMetricFamily(
        "jobsd_job_run_seconds", "Handler run time, by type.", labels=["type"]
    )
    bounds: Sequence[float] = run_s.bounds_s
    for type_, counts in sorted(run_s.counts.items()):
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip([*bounds, math.inf], counts, strict=False):
            cumulative += count
            buckets.append(("+Inf" if math.isinf(bound) else repr(float(bound)), cumulative))
        family.add_metric([type_], buckets, sum_value=run_s.sums_s.get(type_, 0.0))
    return family


class RequestMetrics:
    """ASGI middleware counting requests by method, route template and status."""

    def __init__(self, app: ASGIApp, counter: Counter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in _METHODS else "other"
            self.counter.labels(method, route, str(status)).inc()


def request_counter(registry: CollectorRegistry) -> Counter:
    """Create the request counter in ``registry``."""
    return Counter(
        "jobsd_http_requests",
        "HTTP requests answered, by method, route and status.",
        ["method", "route", "status"],
        registry=registry,
    )


def metrics_router(backend: ApiBackend, registry: CollectorRegistry) -> APIRouter:
    """Build /metrics; register the jobsd collector in ``registry``."""
    collector = JobsdCollector(backend)
    registry.register(collector)
    router = APIRouter(tags=["health"], generate_unique_id_function=endpoint_name)

    @router.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus text exposition format.",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
        summary="Prometheus metrics",
    )
    async def metrics() -> Response:
        await collector.refresh()
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return router
