"""Call the ``on_fail`` hooks of failed jobs, best-effort, off the write path.

Model: the database says which failed jobs still need their hook, whatever moved them
to ``failed``: this daemon's completer or sweeper, a dependency cascade (a trigger), an
operator's ``jobsd resolve --failed``, another daemon. A pass claims them in
``jobsd.fail_hooks`` (one row per job: at most one call per failure, across every
daemon), then calls each hook. A pass runs when this daemon wrote a failure (``submit``
wakes it) and every ``interval_s`` (jittered) for the failures written elsewhere.
The claim comes before the call: a daemon that dies between the two loses that call
(best effort, never twice).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
from anyio.abc import TaskStatus

from jobsd.models import Job
from jobsd.registry import Registry
from jobsd.store import handlers as store
from jobsd.store.db import AsyncPool, acquire
from jobsd.worker.clock import Clock
from jobsd.worker.loop import jitter, run_loop
from jobsd.worker.waker import Waker

__all__ = ["FailHooks", "HooksSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HooksSettings:
    """Who calls hooks, how often it looks for failures, how long one hook may take."""

    worker_id: str = "jobsd"
    timeout_s: float = 30.0
    interval_s: float = 5.0
    """``JOBSD_DEATH_CHECK_INTERVAL``: how late a failure written elsewhere is seen"""
    lookback_s: float = 86_400.0
    """failures older than this (a day) are not looked at any more"""


@dataclass(eq=False, repr=False)
class FailHooks:
    """Run each failed job's ``on_fail`` once; a hook's error is logged, never raised.

    Called after every move to ``failed``, so the owning module can bring its own state
    in line.
    """

    pool: AsyncPool
    cfg: HooksSettings
    clock: Clock
    registry: Registry
    _wake: Waker = field(default_factory=Waker, init=False)
    calls: int = field(default=0, init=False)

    def _hooked_types(self) -> list[str]:
        return [t for t in self.registry.types() if (s := self.registry.get(t)) and s.on_fail]

    def submit(self, job: Job) -> None:
        """Say that ``job`` failed here: look for hooks to call now; never blocks."""
        spec = self.registry.get(job.type)
        if spec is not None and spec.on_fail is not None:
            self._wake.wake("failed")

    async def run_once(self) -> int:
        """Claim and call every hook due now; return how many were called."""
        types = self._hooked_types()
        called = 0
        while types:
            async with acquire(self.pool, "on_fail claim") as conn:
                jobs = await store.claim_fail_hooks(
                    conn,
                    types=types,
                    worker_id=self.cfg.worker_id,
                    lookback_s=self.cfg.lookback_s,
                    now=self.clock.sql_now(),
                )
            for job in jobs:
                called += await self._call(job)
            if not jobs:
                break
        return called

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Call hooks as jobs fail, until cancelled."""

        async def wait() -> None:
            await self._wake.wait(jitter(self.cfg.interval_s))

        await run_loop("on_fail hooks", self.run_once, wait, self.clock, task_status=task_status)

    async def _call(self, job: Job) -> int:
        spec = self.registry.get(job.type)
        if spec is None or spec.on_fail is None:
            return 0
        self.calls += 1
        log.info("job.on_fail", extra={"job_id": str(job.id), "type": job.type})
        try:
            with anyio.fail_after(self.cfg.timeout_s):
                if inspect.iscoroutinefunction(spec.on_fail):
                    await spec.on_fail(job)
                else:
                    await anyio.to_thread.run_sync(spec.on_fail, job, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception:
            log.error(
                "job.on_fail_error", extra={"job_id": str(job.id), "type": job.type}, exc_info=True
            )
        return 1
