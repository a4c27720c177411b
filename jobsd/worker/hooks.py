"""Call the ``on_fail`` hooks of failed jobs, best-effort, off the write path."""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import anyio
import anyio.to_thread
from anyio.abc import TaskStatus

from jobsd.models import Job
from jobsd.registry import Registry
from jobsd.worker.clock import Clock
from jobsd.worker.loop import run_loop
from jobsd.worker.mailbox import Mailbox

__all__ = ["FailHooks", "HooksSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HooksSettings:
    """How long one ``on_fail`` hook may take before it is abandoned."""

    timeout_s: float = 30.0


class FailHooks:
    """Run each failed job's ``on_fail`` once; a hook's error is logged, never raised.

    Called after every move to ``failed``, by the completer and by the sweeper alike, so
    the owning module can bring its own state in line (seed 000 §2.3).
    """

    def __init__(self, cfg: HooksSettings, clock: Clock, registry: Registry) -> None:
        self.cfg = cfg
        self.clock = clock
        self.registry = registry
        self._inbox: Mailbox[Job] = Mailbox()
        self.calls = 0

    def submit(self, job: Job) -> None:
        """Queue the hook of a failed job; never blocks."""
        spec = self.registry.get(job.type)
        if spec is not None and spec.on_fail is not None:
            self._inbox.put(job)

    async def run_once(self) -> int:
        """Call every queued hook now; return how many were called."""
        called = 0
        while self._inbox:
            called += await self._call(self._inbox.take())
        return called

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Call hooks as jobs fail, until cancelled."""
        await run_loop(
            "on_fail hooks", self.run_once, self._inbox.wait, self.clock, task_status=task_status
        )

    async def _call(self, job: Job) -> int:
        spec = self.registry.get(job.type)
        if spec is None or spec.on_fail is None:
            return 0
        self.calls += 1
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
