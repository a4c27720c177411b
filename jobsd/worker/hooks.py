"""Call the ``on_fail`` hooks of failed jobs, best-effort, off the write path."""

from __future__ import annotations

import inspect
import logging

import anyio
import anyio.to_thread

from jobsd.models import Job
from jobsd.registry import Registry

__all__ = ["FailHooks"]

log = logging.getLogger(__name__)


class FailHooks:
    """Run each failed job's ``on_fail`` once; a hook's error is logged, never raised.

    Called after every move to ``failed``, by the completer and by the sweeper alike, so
    the owning module can bring its own state in line (seed 000 §2.3).
    """

    def __init__(self, registry: Registry, *, timeout_s: float = 30.0) -> None:
        self.registry = registry
        self.timeout_s = timeout_s
        self._queue: list[Job] = []
        self._ready = anyio.Event()
        self.calls = 0

    def submit(self, job: Job) -> None:
        """Queue the hook of a failed job; never blocks."""
        spec = self.registry.get(job.type)
        if spec is not None and spec.on_fail is not None:
            self._queue.append(job)
            self._ready.set()

    async def run(self) -> None:
        """Call hooks as jobs fail, until cancelled."""
        while True:
            await self._ready.wait()
            self._ready = anyio.Event()
            await self.drain()

    async def drain(self) -> None:
        """Call every queued hook now."""
        while self._queue:
            await self._call(self._queue.pop(0))

    async def _call(self, job: Job) -> None:
        spec = self.registry.get(job.type)
        if spec is None or spec.on_fail is None:
            return
        self.calls += 1
        try:
            with anyio.fail_after(self.timeout_s):
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
