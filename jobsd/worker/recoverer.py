"""Ask a type's ``recover`` hook what became of a job whose outcome is unknown.

One rule for every ambiguous end of an ``at_most_once`` job whose type has a
``recover`` hook (owner death, shutdown past the drain, timeout or stall, a cancel of
the running job, a lost child) and for a sync handler's job abandoned at its timeout:
the job is written ``recovery_required`` first, then the hook is asked and its answer
applied: ``succeeded`` (reason ``recovered_after_publish``), a re-run (``queued``
while attempts remain, else ``failed``), or ``AMBIGUOUS`` (stays for an operator).
A hook that fails or hangs (``timeout_s``) leaves the job ``recovery_required``.
Two exceptions to a re-run: a job cancelled while running becomes ``cancelled``
(the user asked for it to stop), and a job whose abandoned thread still runs stays
``recovery_required`` (running it again now could run it twice at once).
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import assert_never

import anyio
import anyio.to_thread
from anyio.abc import TaskStatus

from jobsd.models import Job
from jobsd.recovery import AMBIGUOUS, Recovery
from jobsd.registry import Registry
from jobsd.store import queries
from jobsd.store.db import AsyncPool, acquire
from jobsd.worker.clock import Clock
from jobsd.worker.decide import End, Facts, Rules, decide
from jobsd.worker.loop import run_loop
from jobsd.worker.mailbox import Mailbox

__all__ = ["Recoverer", "RecovererSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecovererSettings:
    """Who writes the hook's answer, and how long a hook may take."""

    worker_id: str
    timeout_s: float = 30.0


def _never_running(job_id: uuid.UUID) -> bool:
    return False


@dataclass(eq=False, repr=False)
class Recoverer:
    """Settle ``recovery_required`` jobs with their type's ``recover`` hook."""

    pool: AsyncPool
    cfg: RecovererSettings
    clock: Clock
    registry: Registry
    on_failed: Callable[[Job], None]
    still_running: Callable[[uuid.UUID], bool] = _never_running
    _inbox: Mailbox[Job] = field(default_factory=Mailbox, init=False)
    _passing: anyio.Lock = field(default_factory=anyio.Lock, init=False)
    asked: int = field(default=0, init=False)

    def submit(self, job: Job) -> None:
        """Queue a job just written ``recovery_required``; never blocks."""
        spec = self.registry.get(job.type)
        if spec is not None and spec.recover is not None:
            self._inbox.put(job)

    async def run_once(self) -> int:
        """Settle every queued job now; return how many hooks were asked."""
        # one pass at a time, and a job leaves the inbox once settled: the shutdown's
        # last pass waits for the service's and finds what a cancelled pass left
        async with self._passing:
            asked = 0
            while self._inbox:
                (job,) = self._inbox.peek(1)
                await self.recover(job)
                self._inbox.drop(1)
                asked += 1
            return asked

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Settle jobs as they come, until cancelled."""
        await run_loop(
            "recover", self.run_once, self._inbox.wait, self.clock, task_status=task_status
        )

    async def recover(self, job: Job) -> Job:
        """Ask the hook about a ``recovery_required`` job and apply its answer; return
        the job as it is now."""
        spec = self.registry.get(job.type)
        if spec is None or spec.recover is None:
            return job
        self.asked += 1
        hook = spec.recover
        answer: Recovery = AMBIGUOUS
        try:
            with anyio.fail_after(self.cfg.timeout_s):
                if inspect.iscoroutinefunction(hook):
                    answer = await hook(job)
                else:
                    result = await anyio.to_thread.run_sync(hook, job, abandon_on_cancel=True)
                    answer = await result if inspect.isawaitable(result) else result
            if not isinstance(answer, Recovery):
                raise TypeError(f"recover hook returned {answer!r}, not a Recovery")
        except Exception:
            log.error("job.recover_failed", extra={"job_id": str(job.id)}, exc_info=True)
            return job
        match answer.action:
            case "ambiguous":
                log.info("job.recovery_required", extra={"job_id": str(job.id)})
                return job
            case "succeeded":
                status, reason, error = "succeeded", "recovered_after_publish", None
            case "rerun":
                facts = Facts(
                    job.attempts,
                    cancel_pending=job.reason == "cancel requested"
                    or job.cancel_requested_at is not None,
                    thread_alive=self.still_running(job.id),
                )
                verdict = decide(End.RERUN, Rules.of(spec), facts)
                if verdict.status == "recovery_required":
                    log.info("job.rerun_refused", extra={"job_id": str(job.id)})
                    return job
                status, reason, error = str(verdict.status), verdict.reason, verdict.error
            case _:
                assert_never(answer.action)
        async with acquire(self.pool, "recover") as conn:
            written = await queries.resolve_job(
                conn,
                job.id,
                status=status,
                reason=reason,
                actor=self.cfg.worker_id,
                report=answer.report,
                error=error,
            )
        if written is not None:
            log.info(
                "job.recovered",
                extra={"job_id": str(job.id), "status": status, "reason": reason},
            )
            if written.status == "failed":
                self.on_failed(written)
        return written or job
