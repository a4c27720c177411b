"""Run the queued jobs of a test's database in the test's process, the daemon's way.

``JobsdWorker.drain`` wires the daemon's own services (``jobsd.worker``) the way the
supervisor does, minus the ones that watch over time (listener, heartbeat, sweeper,
lifeline): the claimer claims with the daemon's statement, the job runner runs the
handler under its type's limits and turns what happened into an outcome, the completer
writes it conditioned on the lease (a failure with its cause, a retry with its
back-off), then the ``on_fail`` and ``recover`` hooks are called. One job at a time,
in claim order (priority, then oldest first), until no job is ready.

Ready means ``queued`` now, in a queue that is not paused: a job whose ``run_after``
is later (a retry's back-off included) is not run unless ``include_scheduled``, which
promotes every scheduled job as if its time had come. Every handler runs in the test's
process (sync ones in a thread, as with ``JOBSD_ISOLATION=none``), so what a test
patches, its handlers see.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal

import anyio

from jobsd.errors import ConfigError
from jobsd.models import Job, JobStatus
from jobsd.registry import Registry, default_registry
from jobsd.settings import Settings
from jobsd.store import testing as store
from jobsd.store.connect import make_async_pool
from jobsd.store.db import AsyncPool, acquire
from jobsd.worker.claimer import Claimer, ClaimerSettings
from jobsd.worker.clock import SYSTEM_CLOCK, Clock
from jobsd.worker.completer import Completer, CompleterSettings
from jobsd.worker.executor import JobRunner, RunLimits, RunnerSettings
from jobsd.worker.holdings import Holdings
from jobsd.worker.hooks import FailHooks, HooksSettings
from jobsd.worker.recoverer import Recoverer, RecovererSettings
from jobsd.worker.stats import DaemonStats
from jobsd.worker.waker import Waker

__all__ = ["DrainLimitExceeded", "JobResult", "JobsdWorker"]

MAX_JOBS = 1000
"""the most runs one drain makes before it gives up (a handler that enqueues forever)"""

_FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)


class DrainLimitExceeded(AssertionError):
    """A drain ran its most jobs and jobs were still ready."""


@dataclass(frozen=True, slots=True)
class JobResult:
    """A job a drain ran, as it was when the drain ended."""

    id: uuid.UUID
    type: str
    status: JobStatus
    """``succeeded``, ``failed``; ``scheduled`` for a retry not yet due; any other
    state the job's type and policies lead to (``recovery_required``, ``queued``)"""
    result: dict[str, Any] | None
    """the job's report: what the handler returned, or the cause of its failure
    (``{"error": {"message", "type", "traceback"}}``)"""
    error: str | None
    """the short failure message (``ValueError: no such order``), at most 2 KiB"""
    attempts: int
    """runs started, the retries included"""
    reason: str | None
    payload: dict[str, Any]
    org_id: str
    queue: str
    job: Job
    """the whole row"""

    @classmethod
    def of(cls, job: Job) -> JobResult:
        """Return the result of ``job`` as read back."""
        return cls(
            id=job.id,
            type=job.type,
            status=job.status,
            result=job.report,
            error=job.error,
            attempts=job.attempts,
            reason=job.reason,
            payload=job.payload,
            org_id=job.org_id,
            queue=job.queue,
            job=job,
        )


class _AllDueClock:
    """The system clock, except that statements see a far future: every scheduled job
    is due. Only the claimer's promotion reads it."""

    monotonic = staticmethod(time.monotonic)

    def now(self) -> datetime:
        return SYSTEM_CLOCK.now()

    async def sleep(self, seconds: float) -> None:
        await SYSTEM_CLOCK.sleep(seconds)

    def sql_now(self) -> datetime:
        return _FAR_FUTURE


class JobsdWorker:
    """Run the jobs of the database at ``database_url`` on demand, in this process.

    ``registry`` holds the handlers (default: ``@jobsd.handler``'s registry);
    ``modules`` are imported first, as ``JOBSD_HANDLERS`` names them for a daemon.
    ``settings`` give the limits of the runs (default: the ``JOBSD_*`` environment,
    ``JOBSD_DEFAULT_TIMEOUT`` and the like).
    """

    def __init__(
        self,
        database_url: str,
        *,
        registry: Registry | None = None,
        modules: Sequence[str] = (),
        settings: Settings | None = None,
    ) -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                raise ConfigError(f"cannot import handler module {name!r}: {exc}") from exc
        self.database_url = database_url
        self.registry = registry if registry is not None else default_registry
        self.settings = settings if settings is not None else Settings()
        self.worker_id = f"jobsd-testing:{socket.gethostname()}:{os.getpid()}"

    def drain(
        self,
        *,
        include_scheduled: bool = False,
        queues: Sequence[str] | None = None,
        unknown_types: Literal["fail", "leave"] = "fail",
        max_jobs: int = MAX_JOBS,
    ) -> list[JobResult]:
        """Run every ready job, and those they enqueue, until none is ready; return each
        job run, in the order of its first run, as it ended.

        For synchronous tests: it runs an event loop of its own (an async test awaits
        ``drain_async``). ``include_scheduled`` runs the jobs due later too (retries
        included: a job whose retries all fail ends ``failed``); ``queues`` limits the
        drain to those queues; ``unknown_types="fail"`` fails a job of a type without a
        handler (``unknown type``), ``"leave"`` leaves it queued. Raises
        DrainLimitExceeded after ``max_jobs`` runs with jobs still ready.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "JobsdWorker.drain() was called in a running event loop: "
                "use `await jobsd_worker.drain_async()` there"
            )
        return anyio.run(
            partial(
                self.drain_async,
                include_scheduled=include_scheduled,
                queues=queues,
                unknown_types=unknown_types,
                max_jobs=max_jobs,
            )
        )

    async def drain_async(
        self,
        *,
        include_scheduled: bool = False,
        queues: Sequence[str] | None = None,
        unknown_types: Literal["fail", "leave"] = "fail",
        max_jobs: int = MAX_JOBS,
    ) -> list[JobResult]:
        """Run every ready job until none is ready, in the running event loop; see
        ``drain``."""
        if unknown_types not in ("fail", "leave"):
            raise ValueError(f"unknown_types must be 'fail' or 'leave', not {unknown_types!r}")
        pool = make_async_pool(
            self.database_url, name="testing", min_size=1, max_size=2, timeout_s=10.0
        )
        await pool.open(wait=True)
        try:
            run = _Drain(self, pool, include_scheduled, queues, unknown_types, max_jobs)
            ran = await run.run()
            async with acquire(pool, "read of the drained jobs") as conn:
                ended = await store.jobs_by_id(conn, ran)
        finally:
            await pool.close()
        return [JobResult.of(ended[job_id]) for job_id in ran if job_id in ended]


def _in_process(registry: Registry) -> Registry:
    """Return a copy of ``registry`` whose types all run in this process."""
    copy = Registry()
    for name in registry.types():
        spec = registry.get(name)
        if spec is not None:
            copy.add(dataclasses.replace(spec, isolation="none"))
    return copy


class _Drain:
    """One drain: the daemon's services on one slot, stepped until no job is ready."""

    def __init__(
        self,
        worker: JobsdWorker,
        pool: AsyncPool,
        include_scheduled: bool,
        queues: Sequence[str] | None,
        unknown_types: Literal["fail", "leave"],
        max_jobs: int,
    ) -> None:
        settings, worker_id = worker.settings, worker.worker_id
        registry = _in_process(worker.registry)
        clock: Clock = SYSTEM_CLOCK
        self.max_jobs = max_jobs
        self.ran: dict[uuid.UUID, None] = {}
        self.runs = 0
        self.failed = False
        self.holdings = Holdings(1, clock)
        stats = DaemonStats(known=registry.get)
        waker = Waker()
        self.hooks = FailHooks(pool, HooksSettings(worker_id=worker_id), clock, registry)
        self.recoverer = Recoverer(
            pool,
            RecovererSettings(worker_id=worker_id),
            clock,
            registry,
            self._failed,
            still_running=lambda job_id: self.runner.thread_alive(job_id),
        )
        self.completer = Completer(
            pool,
            CompleterSettings(worker_id=worker_id),
            clock,
            self.holdings,
            stats,
            waker,
            self._failed,
            self.recoverer.submit,
        )
        self.runner = JobRunner(
            RunnerSettings(
                grace_s=0.0,
                limits=RunLimits(
                    isolation="none",
                    stall_after_s=settings.stall_after,
                    max_report_bytes=settings.max_report_bytes,
                    default_timeout_s=settings.default_timeout,
                ),
                max_progress_bytes=settings.max_progress_bytes,
                slots=1,
            ),
            clock,
            registry,
            self.holdings,
            stats,
            self.completer.submit,
        )
        self.claimer = Claimer(
            pool,
            ClaimerSettings(
                worker_id=worker_id,
                queues=tuple(queues or ()),
                poll_interval_s=settings.poll_interval,
                known_types_only=unknown_types == "leave",
            ),
            _AllDueClock() if include_scheduled else clock,
            registry,
            self.holdings,
            waker,
            stats,
            self._start,
        )

    def _failed(self, job: Job) -> None:
        self.failed = True
        self.hooks.submit(job)

    def _start(self, job: Job) -> None:
        self.ran.setdefault(job.id, None)
        self.runs += 1
        self.runner.start(job)

    async def run(self) -> list[uuid.UUID]:
        """Claim, run and settle jobs one by one until none is ready; return the ids of
        the jobs run, in the order of their first run."""
        error: Exception | None = None
        async with anyio.create_task_group() as tg:
            await tg.start(self.runner.run)
            try:
                await self._run_all()
            except Exception as exc:  # raised as it is, not in the task group's group
                error = exc
            finally:
                self.runner.close()
        if error is not None:
            raise error
        return list(self.ran)

    async def _run_all(self) -> None:
        while True:
            if self.runs >= self.max_jobs:
                raise DrainLimitExceeded(
                    f"drain ran {self.runs} jobs and stopped: jobs are still ready (does "
                    "a handler enqueue jobs without end?); pass max_jobs to allow more"
                )
            # promote the due scheduled jobs (all of them with include_scheduled), then
            # claim one: the daemon's statements
            if (await self.claimer.run_once("poll")).claimed == 0:
                return
            await self.holdings.wait_idle()
            await self._settle()

    async def _settle(self) -> None:
        """Write the outcomes of the runs, then call the hooks they call for."""
        while self.completer.pending:
            await self.completer.run_once()
        await self.recoverer.run_once()
        if self.failed:
            self.failed = False
            await self.hooks.run_once()
