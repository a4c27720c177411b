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
import importlib
import logging
import signal
import time
from collections.abc import Callable

import anyio
from anyio.abc import TaskGroup

from jobsd.errors import ConfigError
from jobsd.http import serve as serve_http
from jobsd.http.settings import HttpSettings
from jobsd.models import Job
from jobsd.registry import Registry, default_registry
from jobsd.settings import Settings
from jobsd.store import queries
from jobsd.store.db import AsyncPool, acquire, make_async_pool
from jobsd.worker import sdnotify
from jobsd.worker.claimer import Claimer
from jobsd.worker.completer import Completer
from jobsd.worker.executor import Outcome, failure, make_context, run_handler
from jobsd.worker.heartbeat import Heartbeat
from jobsd.worker.holdings import Held, Holdings
from jobsd.worker.hooks import FailHooks
from jobsd.worker.lifeline import Lifeline
from jobsd.worker.listener import Listener
from jobsd.worker.stats import DaemonStats
from jobsd.worker.sweeper import Sweeper
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

    Build it inside the event loop that runs it.
    """

    def __init__(
        self,
        settings: Settings,
        registry: Registry | None = None,
        *,
        http: HttpSettings | None = None,
    ) -> None:
        if not settings.database_url:
            raise ConfigError("no database configured: set JOBSD_DATABASE_URL")
        self.settings = settings
        self.http = http if http is not None else HttpSettings()
        self.registry = registry or default_registry
        self.stats = DaemonStats()
        self.waker = Waker()
        self.holdings = Holdings(settings.slots)
        self.pool: AsyncPool = make_async_pool(
            settings.database_url,
            name="daemon",
            min_size=2,
            max_size=max(settings.pool_size, 4),
            timeout_s=10.0,
        )
        self.hooks = FailHooks(self.registry)
        self.completer = Completer(
            self.pool,
            self.holdings,
            self.stats,
            self.hooks.submit,
            worker_id=settings.worker_id,
            on_scheduled=lambda: self.waker.wake("scheduled"),
            on_key_freed=lambda: self.waker.wake("key"),
        )
        self.heartbeat = Heartbeat(self.pool, self.holdings, settings)
        self.sweeper = Sweeper(self.pool, settings, self.registry, self.stats, self.hooks.submit)
        self.listener = Listener(settings.database_url, settings.queues, self.waker, self.stats)
        self.lifeline = Lifeline(
            settings.database_url, settings.worker_id, settings.death_check_interval
        )
        self._jobs_tg: TaskGroup | None = None
        self.claimer = Claimer(
            self.pool,
            settings,
            self.registry,
            self.holdings,
            self.waker,
            self.stats,
            self._start_job,
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
        async with acquire(self.pool, "watchdog check") as conn:
            await queries.run_named(conn, "api_ping", {})
        return True

    def stop(self) -> None:
        """Begin a graceful shutdown (what SIGTERM does)."""
        if self.stopping:
            # second request: stop waiting for running handlers
            if self._jobs_tg is not None:
                self._jobs_tg.cancel_scope.cancel()
            return
        self.stopping = True
        sdnotify.stopping()
        log.info("daemon.stopping", extra={"running": self.holdings.running})
        self._start_scope.cancel()
        self._claim_scope.cancel()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until stopped; return once every outcome is written."""
        log.info(
            "daemon.starting",
            extra={
                "worker_id": self.settings.worker_id,
                "slots": self.settings.slots,
                "types": self.registry.types(),
                "queues": self.settings.queues or "all",
            },
        )
        await self.pool.open(wait=False)
        try:
            async with anyio.create_task_group() as services:
                if handle_signals:
                    services.start_soon(self._watch_signals)
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
                    await services.start(self.lifeline.run)
                if not self.stopping:
                    services.start_soon(self.completer.run)
                    services.start_soon(self.heartbeat.run)
                    services.start_soon(self.sweeper.run)
                    services.start_soon(self.hooks.run)
                    await self._run_jobs()
                    await self.completer.drain(timeout_s=max(self.settings.drain_timeout, 10.0))
                    with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                        await self.hooks.drain()
                services.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.pool.close()
        log.info("daemon.stopped", extra={"worker_id": self.settings.worker_id})

    async def _run_jobs(self) -> None:
        async with anyio.create_task_group() as jobs_tg:
            self._jobs_tg = jobs_tg
            with self._claim_scope:
                self._ready.set()
                log.info("daemon.ready", extra={"worker_id": self.settings.worker_id})
                await self.claimer.run()
            # no more claims: give running handlers the drain timeout
            with anyio.move_on_after(self.settings.drain_timeout):
                await self.holdings.wait_idle()
            jobs_tg.cancel_scope.cancel()
        self._jobs_tg = None

    def _start_job(self, job: Job) -> None:
        assert self._jobs_tg is not None
        ctx = make_context(job)
        held = self.holdings.add(job, ctx)
        self._jobs_tg.start_soon(self._execute, held, name=f"job {job.id}")

    async def _execute(self, held: Held) -> None:
        job = held.job
        outcome: Outcome | None = None
        try:
            with held.scope:
                outcome = await run_handler(job, self.registry.get(job.type), held.ctx)
        except anyio.get_cancelled_exc_class():
            # shutdown past the drain timeout: write the job back, then let go
            self.holdings.release_slot(held)
            self.completer.submit(held, self._interrupted(job))
            raise
        self.holdings.release_slot(held)
        self.stats.run_s.observe(job.type, time.monotonic() - held.started_monotonic)
        if outcome is None and held.cancel_requested and not held.lost:
            outcome = Outcome(status="cancelled", reason="cancel requested")
        if outcome is None:  # our scope was cancelled: the lease is gone
            self.completer.submit(held, failure("lease lost", reason="lease lost"))
            return
        self.completer.submit(held, outcome)

    def _interrupted(self, job: Job) -> Outcome:
        spec = self.registry.get(job.type)
        # an interrupted run's outcome is unknown: only at_least_once may run it again
        if (
            spec is not None
            and spec.delivery == "at_least_once"
            and job.attempts < spec.max_attempts
        ):
            return Outcome(status="queued", reason="shutdown")
        return failure(
            "interrupted: the daemon shut down before the job finished", reason="shutdown"
        )

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
            await sdnotify.Watchdog(daemon.healthy).run()

        async with anyio.create_task_group() as tg:
            # a daemon stopped before it was ready never sets `ready`: do not wait for it
            tg.start_soon(announce)
            await daemon.run()
            tg.cancel_scope.cancel()

    anyio.run(main)
