"""What a run's end becomes: one pure function, ``decide``, for every end.

The executor (a handler's return, error, timeout, stall, crash, a cancel, the stop, the
fence), the sweeper (an owner dead or unresponsive: its statements apply the verdicts,
they hold no rule of their own) and the recoverer (a recover hook asking for a rerun)
all ask it. Its inputs are what happened (``End``), the type's rules (``Rules``:
delivery, attempts allowed, a recover hook) and the run's facts (``Facts``: the attempt
it was, a cancel request pending, a retry policy matching the error, a thread that
could not be stopped). Its answer is the next state, the reason written with it, and
for the ends jobsd itself decides, the cause kept in ``error``.

The table, by delivery (``recover``: an at-most-once type with a recover hook):

============================  ===========================  ==================  ====================
end                           at_least_once                at_most_once        recover
============================  ===========================  ==================  ====================
returned                      succeeded                    succeeded           succeeded
raised, policy matches [1]    scheduled (retry)            scheduled (retry)   scheduled (retry)
raised / rejected             failed                       failed              failed
timeout, stall [2]            scheduled if policy [1],     failed              recovery_required
                              else failed
thread not stoppable [3]      recovery_required            recovery_required   recovery_required
child crashed                 failed                       failed              recovery_required
cancel requested (running)    cancelled                    cancelled           recovery_required
shutdown, fenced [4]          queued [5], else failed      failed              recovery_required
owner died / unresponsive [4] queued [5], else failed      failed (worker      recovery_required
                              (max attempts exceeded)      lost)               (worker lost)
recover hook: rerun [6]       queued [5], else failed (max attempts exceeded)
============================  ===========================  ==================  ====================

[1] the type's ``RetryPolicy`` matches the error and attempts remain; a timeout counts
as a ``TimeoutError``. [2] the handler was stopped. [3] a sync handler in the daemon
past its timeout or stall: its work may still happen. [4] with a cancel request pending
the user's wish wins: ``cancelled`` (``recovery_required`` for ``recover``: the work may
have happened). [5] while ``attempts < max_attempts``. [6] ``cancelled`` when the run
ended by a cancel request or one is pending; the job stays ``recovery_required`` while
a thread of its run still runs (a rerun now could run it twice at once).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from jobsd.models import JobStatus
from jobsd.registry import HandlerSpec, Registry
from jobsd.store.queries import RescueCandidate, RescueDecider, RescueVerdict

__all__ = ["End", "Facts", "Rules", "Verdict", "decide", "rescuer", "rules_from"]


class End(enum.StrEnum):
    """What happened to a run; each value is the reason it is written with, unless the
    verdict says otherwise."""

    RETURNED = "returned"
    RAISED = "handler error"
    REJECTED = "rejected"
    """the handler returned something jobsd cannot store (the caller names the reason)"""
    TIMEOUT = "timeout"
    STALLED = "stalled"
    CRASHED = "handler crashed"
    MEMORY = "memory limit"
    """the handler process passed its memory ceiling and was killed"""
    CANCELLED = "cancel requested"
    SHUTDOWN = "shutdown"
    FENCED = "fenced"
    OWNER_DIED = "owner died"
    OWNER_UNRESPONSIVE = "owner unresponsive"
    RERUN = "recovered: rerun"


Delivery = Literal["at_least_once", "at_most_once"]

_RESCUES = frozenset({End.OWNER_DIED, End.OWNER_UNRESPONSIVE})
_INTERRUPTIONS = frozenset({End.SHUTDOWN, End.FENCED, *_RESCUES})
_LIMITS = frozenset({End.TIMEOUT, End.STALLED})


@dataclass(frozen=True, slots=True)
class Rules:
    """What a type declares about its runs' ends."""

    delivery: Delivery = "at_least_once"
    max_attempts: int = 1
    recover: bool = False
    """an at-most-once type with a recover hook: an ambiguous end asks it"""

    @classmethod
    def of(cls, spec: HandlerSpec | None, default_max_attempts: int = 1) -> Rules:
        """Return a type's rules (the defaults for a type without a handler here)."""
        if spec is None:
            return cls(max_attempts=default_max_attempts)
        delivery: Delivery = "at_most_once" if spec.delivery == "at_most_once" else "at_least_once"
        return cls(delivery, spec.max_attempts, spec.recover is not None)

    @property
    def recovers(self) -> bool:
        """Say whether an ambiguous end goes to the recover hook."""
        return self.delivery == "at_most_once" and self.recover


@dataclass(frozen=True, slots=True)
class Facts:
    """What is known of the run beyond how it ended."""

    attempts: int
    """the attempt it was (the job's ``attempts``)"""
    cancel_pending: bool = False
    """a cancel request waits for the job"""
    retry_matches: bool = False
    """the type's retry policy matches the error (a timeout counts as ``TimeoutError``)"""
    thread_alive: bool = False
    """a sync handler's thread could not be stopped"""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The next state, its reason, and the cause jobsd writes in ``error`` (None: the
    caller's own, such as the handler's exception)."""

    status: JobStatus
    reason: str
    error: str | None = None


def decide(end: End, rules: Rules, facts: Facts, *, reason: str | None = None) -> Verdict:
    """Return what a run that ended with ``end`` becomes (the module's table).

    ``reason`` overrides the reason of a handler's own failure (``REJECTED``: ``report
    too large``, ``invalid report``, ``progress too large``)."""
    attempts, max_attempts = facts.attempts, rules.max_attempts
    left = attempts < max_attempts
    if end is End.RETURNED:
        return Verdict(JobStatus.SUCCEEDED, "")
    if end in (End.RAISED, End.REJECTED):
        if end is End.RAISED and facts.retry_matches and left:
            return Verdict(JobStatus.SCHEDULED, "retry")
        return Verdict(JobStatus.FAILED, reason or str(end))
    if end in _LIMITS:
        if facts.thread_alive:
            return Verdict(JobStatus.RECOVERY_REQUIRED, str(end))
        if rules.delivery == "at_most_once":
            status = JobStatus.RECOVERY_REQUIRED if rules.recovers else JobStatus.FAILED
            return Verdict(status, str(end))
        if facts.retry_matches and left:
            return Verdict(JobStatus.SCHEDULED, "retry")
        return Verdict(JobStatus.FAILED, str(end))
    if end in (End.CRASHED, End.MEMORY):
        status = JobStatus.RECOVERY_REQUIRED if rules.recovers else JobStatus.FAILED
        return Verdict(status, str(end))
    if end is End.CANCELLED:
        if rules.recovers:
            return Verdict(JobStatus.RECOVERY_REQUIRED, str(end), _UNKNOWN_AFTER_CANCEL)
        return Verdict(JobStatus.CANCELLED, str(end))
    if end in _INTERRUPTIONS:
        return _interrupted(end, rules, facts)
    if end is End.RERUN:
        if facts.thread_alive:  # running it again now could run it twice at once
            return Verdict(JobStatus.RECOVERY_REQUIRED, "rerun refused: still running")
        if facts.cancel_pending:
            return Verdict(JobStatus.CANCELLED, str(End.CANCELLED))
        if left:
            return Verdict(JobStatus.QUEUED, str(end))
        cause = (
            "max attempts exceeded: the recover hook asked for a rerun at "
            f"attempt {attempts} of {max_attempts}"
        )
        return Verdict(JobStatus.FAILED, cause, cause)
    raise AssertionError(f"unknown end {end!r}")


def _interrupted(end: End, rules: Rules, facts: Facts) -> Verdict:
    """A run stopped from outside its handler: the stop, the fence, a rescue."""
    attempts = facts.attempts
    if facts.cancel_pending:
        # the user asked for it to stop; whether its work happened is the hook's to say
        if rules.recovers:
            return Verdict(JobStatus.RECOVERY_REQUIRED, str(End.CANCELLED), _UNKNOWN_AFTER_CANCEL)
        return Verdict(JobStatus.CANCELLED, str(End.CANCELLED))
    rescue = end in _RESCUES
    # the cause, with the attempt: kept in error (and in history when the job fails)
    cause = f"{end} at attempt {attempts}"
    if rules.delivery == "at_least_once":
        cause += f" of {rules.max_attempts}"
    if rules.delivery == "at_most_once":
        status = JobStatus.RECOVERY_REQUIRED if rules.recovers else JobStatus.FAILED
        if rescue:
            return Verdict(status, "worker lost", f"worker lost: {cause}")
        return Verdict(status, str(end), _STOP_MESSAGES[end])
    if attempts < rules.max_attempts:
        return Verdict(JobStatus.QUEUED, str(end))
    if rescue:
        exhausted = f"max attempts exceeded: {cause}"
        return Verdict(JobStatus.FAILED, exhausted, exhausted)
    return Verdict(JobStatus.FAILED, str(end), _STOP_MESSAGES[end])


_UNKNOWN_AFTER_CANCEL = "cancelled while running: outcome unknown"

_STOP_MESSAGES = {
    End.SHUTDOWN: "interrupted: the daemon shut down before the job finished",
    End.FENCED: (
        "fenced: the daemon could not renew its lease in time and stopped the run "
        "before another daemon could rescue the job"
    ),
}


def rescuer(rules_of: Callable[[str], Rules]) -> RescueDecider:
    """Return the sweeper's decider: what a job rescued from a dead (or unresponsive)
    owner becomes, by its type's rules (``rules_of``)."""

    def rescue(job: RescueCandidate) -> RescueVerdict:
        end = End.OWNER_DIED if job.dead else End.OWNER_UNRESPONSIVE
        facts = Facts(job.attempts, cancel_pending=job.cancel_requested)
        verdict = decide(end, rules_of(job.type), facts)
        return RescueVerdict(str(verdict.status), verdict.reason, verdict.error)

    return rescue


def rules_from(
    registry: Registry | None = None,
    *,
    default_max_attempts: int = 1,
    max_attempts: Mapping[str, int] | None = None,
    deliveries: Mapping[str, str] | None = None,
) -> Callable[[str], Rules]:
    """Return each type's rules: its handler's in ``registry``, else those given by
    type (``deliveries``: ``at_least_once``, ``at_most_once`` or ``recover``), else the
    defaults with ``default_max_attempts``."""

    def rules_of(type: str) -> Rules:
        spec = registry.get(type) if registry is not None else None
        if spec is not None:
            return Rules.of(spec)
        given = (deliveries or {}).get(type)
        attempts = (max_attempts or {}).get(type, default_max_attempts)
        if given == "recover":
            return Rules("at_most_once", attempts, recover=True)
        if given == "at_most_once":
            return Rules("at_most_once", attempts)
        return Rules("at_least_once", attempts)

    return rules_of
