"""Map a job type to its handler and the policy declared with it."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from jobsd.errors import ConfigError
from jobsd.recovery import Recovery
from jobsd.retry import RetryPolicy
from jobsd.sizes import parse_size

if TYPE_CHECKING:
    from jobsd.context import JobContext
    from jobsd.models import Job

__all__ = [
    "DEFAULT_TIMEOUT",
    "DedupScope",
    "Delivery",
    "HandlerSpec",
    "Isolation",
    "Registry",
    "default_registry",
    "handler",
]

DedupScope = Literal["queue", "active"]
Delivery = Literal["at_least_once", "at_most_once"]
Isolation = Literal["auto", "none", "process"]
"""where a type's runs happen: ``process`` (a handler process of the daemon's), ``none``
(in the daemon: the event loop, or a thread for a sync handler), or ``auto``: a process
for a sync handler a child can import, the daemon for the rest"""
HandlerFunc = Callable[["JobContext"], Any]
OnFail = Callable[["Job"], Awaitable[None] | None]
Recover = Callable[["Job"], "Awaitable[Recovery] | Recovery"]
F = TypeVar("F", bound=HandlerFunc)


class _Default(Enum):
    TIMEOUT = "the daemon's JOBSD_DEFAULT_TIMEOUT"


DEFAULT_TIMEOUT: Final = _Default.TIMEOUT
"""``timeout`` of a type that does not give one: the daemon's ``JOBSD_DEFAULT_TIMEOUT``
(``timeout=None`` is no limit at all)"""


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A handler and what its type declares."""

    type: str
    func: HandlerFunc
    is_async: bool
    max_attempts: int = 1
    dedup_scope: DedupScope = "queue"
    on_fail: OnFail | None = None
    timeout_s: float | None = None
    timeout_default: bool = False
    """the type gave no ``timeout``: its runs end at the daemon's default"""
    delivery: Delivery = "at_least_once"
    retry: RetryPolicy | None = None
    recover: Recover | None = None
    # running jobs of one concurrency key at most; None: the queue's limit, else 1
    concurrency_limit: int | None = None
    # None: the daemon's JOBSD_ISOLATION
    isolation: Isolation | None = None
    # seconds without progress after which a run is ended (None: JOBSD_STALL_AFTER)
    stall_after_s: float | None = None
    # a handler process is replaced after this many jobs (None: JOBSD_MAX_JOBS_PER_CHILD)
    max_jobs_per_child: int | None = None
    # a handler process's memory ceiling in bytes (None: JOBSD_MAX_CHILD_MEMORY)
    max_child_memory: int | None = None

    @property
    def import_ref(self) -> str | None:
        """``module:qualname`` of the handler, if a child process can import it."""
        func = self.func
        module = getattr(func, "__module__", None)
        qualname = getattr(func, "__qualname__", "")
        if not module or module == "__main__" or "<locals>" in qualname:
            return None
        return f"{module}:{qualname}"

    def runs_in_process(self, default: Isolation) -> bool:
        """Say whether this type's runs happen in a handler process, ``default`` being
        the daemon's ``JOBSD_ISOLATION``. ``auto`` puts a sync handler in one when a
        child can import it; an explicit ``process`` always does (a handler that
        cannot be imported then fails its runs, saying why)."""
        chosen = self.isolation or default
        if chosen == "auto":
            return not self.is_async and self.import_ref is not None
        return chosen == "process"


class Registry:
    """The handlers a daemon can run, by job type."""

    def __init__(self) -> None:
        self._specs: dict[str, HandlerSpec] = {}

    def add(self, spec: HandlerSpec) -> None:
        """Register a handler; a type can be registered once."""
        if spec.type in self._specs and self._specs[spec.type].func is not spec.func:
            raise ConfigError(f"job type {spec.type!r} already has a handler")
        self._specs[spec.type] = spec

    def get(self, type: str) -> HandlerSpec | None:
        """Return the handler of a type, or None."""
        return self._specs.get(type)

    def types(self) -> list[str]:
        """List the registered types."""
        return sorted(self._specs)

    def keep_dedup_types(self) -> list[str]:
        """List the types whose dedup key is held until the job ends (scope 'active')."""
        return sorted(t for t, s in self._specs.items() if s.dedup_scope == "active")

    def at_most_once_types(self) -> list[str]:
        """List the types delivered at most once (a claim never takes them ahead of a slot)."""
        return sorted(t for t, s in self._specs.items() if s.delivery == "at_most_once")

    def concurrency_limits(self) -> dict[str, int]:
        """Map each type that declares one to its per-key concurrency limit."""
        return {
            t: s.concurrency_limit
            for t, s in self._specs.items()
            if s.concurrency_limit is not None
        }

    def timeouts(self, default_s: float | None) -> dict[str, float | None]:
        """Map each type to how long its runs may take (None: no limit), ``default_s``
        for the types that give no timeout."""
        return {t: default_s if s.timeout_default else s.timeout_s for t, s in self._specs.items()}

    def clear(self) -> None:
        """Forget every handler (tests)."""
        self._specs.clear()


default_registry = Registry()


def handler(
    type: str,
    *,
    max_attempts: int | None = None,
    dedup_scope: DedupScope = "queue",
    on_fail: OnFail | None = None,
    timeout: float | _Default | None = DEFAULT_TIMEOUT,
    delivery: Delivery = "at_least_once",
    retry: RetryPolicy | None = None,
    recover: Recover | None = None,
    concurrency_limit: int | None = None,
    isolation: Isolation | None = None,
    stall_after: float | None = None,
    max_jobs_per_child: int | None = None,
    max_child_memory: int | str | None = None,
    registry: Registry | None = None,
) -> Callable[[F], F]:
    """Register the decorated function as the handler of ``type``.

    The function takes one argument, the JobContext, and returns a JSON object or None
    (the job's report). It may be async (run in the daemon's event loop), or sync (run
    in a handler process of the daemon's: ``isolation``).
    ``max_attempts`` counts runs, the first included: the default 1 never runs a job
    twice. ``timeout`` is in seconds, on the monotonic clock; unset, the daemon's
    ``JOBSD_DEFAULT_TIMEOUT`` (an hour) applies; ``None``: no limit. ``retry`` retries the
    handler's known failures (a ``RetryPolicy``); its ``max_attempts`` is the type's.
    ``recover(job)`` (at_most_once types) decides the fate of a job whose owner died:
    ``jobsd.recovery.succeeded(report)``, ``AMBIGUOUS`` or ``RERUN``.
    ``concurrency_limit``: how many jobs of this type with the same
    ``concurrency_key`` may run at once (default: the queue's limit, else 1).
    ``isolation="process"`` runs the type's jobs in child processes the daemon
    supervises (the handler must be a module-level function; payload, result and
    progress cross as JSON); ``"none"`` runs them in the daemon (a sync one in a
    thread); ``"auto"`` is ``process`` for a sync handler a child can import, else
    ``none``; unset follows ``JOBSD_ISOLATION`` (``auto`` by default).
    ``max_jobs_per_child`` and ``max_child_memory`` (bytes, or ``"512MB"``) recycle
    the handler processes of the type's runs (unset: ``JOBSD_MAX_JOBS_PER_CHILD``,
    ``JOBSD_MAX_CHILD_MEMORY``). ``stall_after`` (seconds): a run that neither returns nor
    reports progress for that long is ended as timed out, cause ``stalled`` (unset
    follows ``JOBSD_STALL_AFTER``, default no limit).
    """
    if recover is not None and delivery != "at_most_once":
        raise ConfigError(f"recover of {type!r} needs delivery='at_most_once'")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigError(f"retry of {type!r} must be a jobsd.RetryPolicy")
    if max_attempts is None:
        max_attempts = retry.max_attempts if retry is not None else 1
    elif retry is not None and retry.max_attempts != max_attempts:
        raise ConfigError(
            f"max_attempts of {type!r} ({max_attempts}) differs from its retry policy's "
            f"({retry.max_attempts}): give it once"
        )
    if max_attempts < 1:
        raise ConfigError(f"max_attempts of {type!r} must be at least 1")
    if dedup_scope not in ("queue", "active"):
        raise ConfigError(f"dedup_scope of {type!r} must be 'queue' or 'active'")
    if delivery not in ("at_least_once", "at_most_once"):
        raise ConfigError(f"delivery of {type!r} must be 'at_least_once' or 'at_most_once'")
    timeout_default = timeout is DEFAULT_TIMEOUT
    timeout_s = None if isinstance(timeout, _Default) else timeout
    if timeout_s is not None and timeout_s <= 0:
        raise ConfigError(f"timeout of {type!r} must be positive")
    if concurrency_limit is not None and concurrency_limit < 1:
        raise ConfigError(f"concurrency_limit of {type!r} must be at least 1")
    if isolation not in (None, "auto", "none", "process"):
        raise ConfigError(f"isolation of {type!r} must be 'auto', 'none' or 'process'")
    if max_jobs_per_child is not None and max_jobs_per_child < 1:
        raise ConfigError(f"max_jobs_per_child of {type!r} must be at least 1")
    try:
        memory = None if max_child_memory is None else parse_size(max_child_memory)
    except ValueError as exc:
        raise ConfigError(f"max_child_memory of {type!r}: {exc}") from None
    if stall_after is not None and stall_after <= 0:
        raise ConfigError(f"stall_after of {type!r} must be positive")

    def register(func: F) -> F:
        (registry or default_registry).add(
            HandlerSpec(
                type=type,
                func=func,
                is_async=inspect.iscoroutinefunction(func),
                max_attempts=max_attempts,
                dedup_scope=dedup_scope,
                on_fail=on_fail,
                timeout_s=timeout_s,
                timeout_default=timeout_default,
                delivery=delivery,
                retry=retry,
                recover=recover,
                concurrency_limit=concurrency_limit,
                isolation=isolation,
                stall_after_s=stall_after,
                max_jobs_per_child=max_jobs_per_child,
                max_child_memory=memory,
            )
        )
        return func

    return register
