"""Start the daemon's services in one task group and shut them down in order.

Shutdown (SIGTERM or SIGINT) has two steps: stop claiming and let running handlers
finish for up to ``drain_timeout``; then cancel what still runs (those jobs are
written back: requeued while attempts remain and the type is ``at_least_once``, else
failed with reason ``shutdown``).
Outcomes are written before exit, inside a shielded scope. A second signal skips the
wait.
"""

from __future__ import annotations

import functools
import gc
import importlib
import logging
import os
import signal
import socket
import uuid
from collections.abc import Callable

import anyio

from jobsd.errors import ConfigError, DatabaseError
from jobsd.http import serve as serve_http
from jobsd.http.settings import HttpSettings
from jobsd.periodic import ScheduleRegistry, default_schedules, load_schedules_file
from jobsd.registry import Registry, default_registry
from jobsd.settings import Settings
from jobsd.store import api, workers
from jobsd.store.connect import make_async_pool
from jobsd.store.db import AsyncConn, AsyncPool, acquire
from jobsd.store.listen import open_listen_connection
from jobsd.worker import sdnotify
from jobsd.worker.archiver import Archiver, ArchiverSettings
from jobsd.worker.claimer import Claimer, ClaimerSettings
from jobsd.worker.clock import SYSTEM_CLOCK, Clock
from jobsd.worker.completer import Completer, CompleterSettings
from jobsd.worker.executor import JobRunner, RunLimits, RunnerSettings
from jobsd.worker.fence import Fence, FenceSettings, exit_now
from jobsd.worker.heartbeat import Heartbeat, HeartbeatSettings
from jobsd.worker.holdings import Holdings
from jobsd.worker.hooks import FailHooks, HooksSettings
from jobsd.worker.lifeline import Lifeline, LifelineSettings
from jobsd.worker.listener import CANCEL_CHANNEL, CHANNEL, Listener, ListenerSettings
from jobsd.worker.recoverer import Recoverer, RecovererSettings
from jobsd.worker.scheduler import Scheduler, SchedulerSettings
from jobsd.worker.starting import Starter, StarterSettings
from jobsd.worker.stats import DaemonStats
from jobsd.worker.sweeper import Sweeper, SweeperSettings
from jobsd.worker.waker import Waker

__all__ = ["Daemon", "import_handlers"]

log = logging.getLogger(__name__)


def import_handlers(modules: list[str]) -> None:
    """Import the handler modules named in settings; their decorators register them."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a broken module: name it, whatever it raised
            raise ConfigError(
                f"cannot import handler module {name!r}: {type(exc).__name__}: {exc}"
            ) from exc


class Daemon:
    """One worker process: N slots, a LISTEN connection, and the services around them.

    Build it inside the event loop that runs it. It only wires the services (each gets
    its slice of the settings and the clock) and starts and stops them.
    """

    def __init__(
        self,
        settings: Settings,
        registry: Registry | None = None,
        *,
        http: HttpSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
        schedules: ScheduleRegistry | None = None,
        on_fence_breach: Callable[[], None] = exit_now,
    ) -> None:
        if not settings.database_url:
            raise ConfigError("no database configured: set JOBSD_DATABASE_URL")
        url = settings.database_url
        self.settings = settings
        self.http = http if http is not None else HttpSettings()
        self.registry = registry or default_registry
        self.clock = clock
        self.stats = DaemonStats(known=self.registry.get)
        self.waker = Waker()
        self.holdings = Holdings(
            settings.slots,
            clock,
            ahead=settings.effective_claim_ahead,
            ahead_max_wait_s=settings.claim_ahead_max_wait,
        )
        self.pool: AsyncPool = make_async_pool(
            url,
            name="daemon",
            min_size=2,
            max_size=max(settings.pool_size, 4),
            timeout_s=10.0,
            statement_timeout_s=settings.statement_timeout,
            on_connect=self._prepare_connection,
        )
        self.hooks = FailHooks(
            self.pool,
            HooksSettings(worker_id=settings.worker_id, interval_s=settings.death_check_interval),
            clock,
            self.registry,
        )
        self.recoverer = Recoverer(
            self.pool,
            RecovererSettings(worker_id=settings.worker_id),
            clock,
            self.registry,
            self.hooks.submit,
            still_running=lambda job_id: self.runner.thread_alive(job_id),
        )
        self.completer = Completer(
            self.pool,
            CompleterSettings(worker_id=settings.worker_id, fault=settings.fault),
            clock,
            self.holdings,
            self.stats,
            self.waker,
            self.hooks.submit,
            self.recoverer.submit,
        )
        self.runner = JobRunner(
            RunnerSettings(
                grace_s=settings.drain_timeout,
                limits=RunLimits(
                    isolation=settings.isolation,
                    stall_after_s=settings.stall_after,
                    max_report_bytes=settings.max_report_bytes,
                    default_timeout_s=settings.default_timeout,
                    max_jobs_per_child=settings.max_jobs_per_child,
                    max_child_memory=settings.max_child_memory,
                ),
                kill_grace_s=settings.kill_grace,
                max_progress_bytes=settings.max_progress_bytes,
                slots=settings.slots,
                fault=settings.fault,
            ),
            clock,
            self.registry,
            self.holdings,
            self.stats,
            self.completer.submit,
            lambda held: self.starter.release(held),
        )
        self.fence = Fence(
            FenceSettings(lease_s=settings.worker_lease),
            clock,
            stop_runs=self.runner.fence,
            still_running=self.runner.busy,
            on_breach=on_fence_breach,
            on_open=self.runner.unfence,
        )
        self.starter = Starter(
            self.pool,
            StarterSettings(durable=settings.durable_claims),
            clock,
            self.holdings,
            self.runner.start_reserved,
        )
        self.claimer = Claimer(
            self.pool,
            ClaimerSettings(
                worker_id=settings.worker_id,
                queues=tuple(settings.queues),
                poll_interval_s=settings.poll_interval,
                known_types_only=settings.unknown_types == "leave",
                durable_claims=settings.durable_claims,
                reserve_s=max(2 * settings.claim_ahead_max_wait, 1.0),
            ),
            clock,
            self.registry,
            self.holdings,
            self.waker,
            self.stats,
            self.runner.start,
            self.fence,
        )
        self.heartbeat = Heartbeat(
            self.pool,
            HeartbeatSettings(
                tick_s=min(settings.progress_interval, settings.effective_heartbeat_s),
                beat_s=settings.effective_heartbeat_s,
            ),
            clock,
            self.holdings,
        )
        self.sweeper = Sweeper(
            self.pool,
            SweeperSettings(
                worker_id=settings.worker_id,
                death_check_interval_s=settings.death_check_interval,
                sweep_interval_s=settings.sweep_interval,
                stale_after_s=settings.stale_after,
                default_max_attempts=settings.default_max_attempts,
            ),
            clock,
            self.registry,
            self.stats,
            self.hooks.submit,
            self.recoverer,
        )
        self.archiver = Archiver(
            self.pool,
            ArchiverSettings(
                archive_after_s=settings.archive_after,
                interval_s=settings.archive_interval,
                batch=settings.archive_batch,
            ),
            clock,
            self.stats,
        )
        self.listener = Listener(
            functools.partial(
                open_listen_connection,
                url,
                CHANNEL,
                CANCEL_CHANNEL,
                application_name="jobsd-listen",
                operation="listen",
            ),
            ListenerSettings(queues=frozenset(settings.queues)),
            clock,
            self.waker,
            self.stats,
            on_cancel=self._cancel_notified,
        )
        self.lifeline = Lifeline(
            functools.partial(workers.open_worker_connection, url),
            LifelineSettings(
                worker_id=settings.worker_id,
                interval_s=settings.lease_renew_s,
                lease_s=settings.worker_lease,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                known_types_only=settings.unknown_types == "leave",
            ),
            clock,
            self.registry,
            on_renewed=self.fence.renewed,
        )
        # the file is checked even when this daemon does not schedule: a bad file is
        # an error at start, not on the day a scheduling daemon restarts
        from_file = load_schedules_file(settings.schedules) if settings.schedules else []
        declared = (schedules or default_schedules).merged(from_file)
        self.scheduler: Scheduler | None = None
        if settings.scheduler and declared:
            self.scheduler = Scheduler(
                self.pool,
                SchedulerSettings(
                    worker_id=settings.worker_id,
                    interval_s=settings.scheduler_interval,
                    grace_s=settings.schedule_grace,
                    catch_up_max=settings.schedule_catch_up_max,
                    max_payload_bytes=settings.max_payload_bytes,
                ),
                clock,
                declared,
            )
        self._start_scope = anyio.CancelScope()
        self._claim_scope = anyio.CancelScope()
        self._ready = anyio.Event()
        self.stopping = False

    @property
    def ready(self) -> anyio.Event:
        """Return the event set once the daemon listens and claims."""
        return self._ready

    async def healthy(self) -> bool:
        """Tell whether the daemon is useful: LISTEN is up and the pool answers a query.

        For the systemd watchdog; a blocked event loop never gets here.
        """
        if self.settings.notify and not self.listener.connected:
            return False
        if not self.making_progress():
            # outcomes pile up and none is written: useless, whatever the ping says
            return False
        async with acquire(self.pool, "watchdog check") as conn:
            await api.ping(conn)
        return True

    def making_progress(self) -> bool:
        """Say whether the services that write get their writes through (for the watchdog
        and /readyz): no outcome has waited past ``JOBSD_OUTCOME_STALL_AFTER`` without a
        write settling any, and the heartbeat and the sweeper's passes have completed
        within that bound (or three of their intervals, when longer)."""
        bound = self.settings.outcome_stall_after
        return not (
            self.completer.stalled(bound)
            or self.heartbeat.stalled(bound)
            or self.sweeper.stalled(bound)
        )

    def _cancel_notified(self, job_id: uuid.UUID) -> None:
        """A cancel request for ``job_id`` committed: cancel its handler if it runs here."""
        if self.holdings.request_cancel_of(job_id):
            log.info("job.cancel_requested", extra={"job_id": str(job_id), "via": "notify"})

    async def _prepare_connection(self, conn: AsyncConn) -> None:
        """Prepare the claim on each new connection of the pool. A refusal (a lock held
        past the statement timeout) costs only the speed of the connection's first
        claims: it is handed out as it is; a connection lost meanwhile is not."""
        try:
            await self.claimer.prepare(conn)
        except DatabaseError as exc:
            if conn.closed:
                raise
            log.warning("daemon.claim_not_prepared", extra={"error": str(exc)})

    def stop(self) -> None:
        """Begin a graceful shutdown (what SIGTERM does)."""
        if self.stopping:
            # second request: stop waiting for running handlers
            self.runner.cancel()
            return
        self.stopping = True
        sdnotify.stopping()
        log.info("daemon.stopping", extra={"running": self.holdings.running})
        self._start_scope.cancel()
        self._claim_scope.cancel()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until stopped; return once every outcome is written.

        With ``handle_signals``, SIGTERM and SIGINT stop it (a second one: without
        waiting for running handlers) until it returns, the close of its connections
        included: a second Ctrl-C that arrives late (``uv run`` forwards the terminal's
        to its child, which got one already) must not end it in a KeyboardInterrupt.
        """
        if not handle_signals:
            await self._run()
            return
        async with anyio.create_task_group() as signals:
            signals.start_soon(self._watch_signals)
            await self._run()
            signals.cancel_scope.cancel()

    async def _run(self) -> None:
        log.info(
            "daemon.starting",
            extra={
                "worker_id": self.settings.worker_id,
                "slots": self.settings.slots,
                "types": self.registry.types(),
                "queues": self.settings.queues or "all",
            },
        )
        # what bounds each type's runs, said once at start (None: nothing does)
        log.info(
            "daemon.timeouts",
            extra={"timeouts": self.registry.timeouts(self.settings.default_timeout)},
        )
        if self.settings.fault is not None:
            log.warning("daemon.fault_armed", extra={"point": self.settings.fault})
        await self.pool.open(wait=False)
        try:
            async with anyio.create_task_group() as services:
                if self.http.http_addr:
                    # up before the database is: /readyz answers 503 meanwhile
                    await services.start(
                        functools.partial(serve_http, self.settings, self.http, daemon=self)
                    )
                # The first LISTEN waits for the database, however long it is away; a
                # stop meanwhile must not wait with it (nothing was claimed yet).
                with self._start_scope:
                    if self.settings.notify:
                        await services.start(self.listener.run)
                    # registered (and locked) before the first claim: a job can only
                    # be owned by a worker whose death the sweeper can prove
                    await services.start(self.fence.run)
                    await services.start(self.lifeline.run)
                if not self.stopping:
                    for service in (
                        self.completer,
                        self.heartbeat,
                        self.starter,
                        self.sweeper,
                        self.archiver,
                        self.recoverer,
                        self.hooks,
                    ):
                        await services.start(service.run)
                    if self.scheduler is not None:
                        await services.start(self.scheduler.run)
                    await self._run_jobs()
                    await self.starter.drain(timeout_s=5.0)
                    await self.completer.drain(timeout_s=max(self.settings.drain_timeout, 10.0))
                    with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                        await self.recoverer.run_once()
                        await self.hooks.run_once()
                services.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.pool.close()
        log.info("daemon.stopped", extra={"worker_id": self.settings.worker_id})

    async def _run_jobs(self) -> None:
        """Claim until stopped; then the runner gives running handlers the drain timeout."""
        async with anyio.create_task_group() as jobs:
            await jobs.start(self.runner.run)
            with self._claim_scope:
                # What start-up made (modules, the app, the registry) lives as long as the
                # daemon: out of the collector's sight, a full collection stops scanning it
                # (one could pause a pickup for milliseconds).
                gc.freeze()
                self._ready.set()
                log.info("daemon.ready", extra={"worker_id": self.settings.worker_id})
                await self.claimer.run()
            # a claim in flight at the stop has ended (it is shielded): no more jobs come
            log.info("daemon.claiming_stopped", extra={"held": len(self.holdings)})
            self.runner.close()

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("daemon.signal", extra={"signal": signal.Signals(signum).name})
                self.stop()


def run_daemon(settings: Settings, *, on_ready: Callable[[], None] | None = None) -> None:
    """Import the handlers and run a daemon in a fresh event loop until it stops."""
    import_handlers(settings.handlers)

    async def main() -> None:
        daemon = Daemon(settings)

        async def announce() -> None:
            await daemon.ready.wait()
            sdnotify.ready(f"claiming with {settings.slots} slots")
            if on_ready is not None:
                on_ready()
            # systemd arms the watchdog at READY; pings stop while the daemon is useless
            watchdog = sdnotify.WatchdogSettings.from_environment()
            await sdnotify.Watchdog(watchdog, daemon.clock, daemon.healthy).run()

        async with anyio.create_task_group() as tg:
            # a daemon stopped before it was ready never sets `ready`: do not wait for it
            tg.start_soon(announce)
            await daemon.run()
            tg.cancel_scope.cancel()

    anyio.run(main)
