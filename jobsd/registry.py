"""Map a job type to its handler and the policy declared with it.

A handler takes the JobContext, and may take its payload as a pydantic model:
``async def import_csv(ctx: JobContext, order: ImportCsv)``. Such a typed handler is
registered wrapped: the daemon calls the wrapper with the context, which validates the
payload through the model (``jobsd.payloads``; a payload that does not validate fails
the job without a retry) and calls the handler with both.
"""

from __future__ import annotations

import builtins
import inspect
import sys
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeVar, overload

from pydantic import BaseModel

from jobsd.errors import ConfigError
from jobsd.payloads import decode_payload
from jobsd.recovery import Recovery
from jobsd.retry import RetryPolicy
from jobsd.sizes import parse_size
from jobsd.task import RUN_ATTRIBUTE, Task

if TYPE_CHECKING:
    from jobsd.context import JobContext
    from jobsd.models import Job

__all__ = [
    "DEFAULT_TIMEOUT",
    "DedupScope",
    "Delivery",
    "HandlerSpec",
    "Isolation",
    "Register",
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
M = TypeVar("M", bound=BaseModel)
P = TypeVar("P")


class Register(Protocol):
    """What ``handler(...)`` returns: it registers a function and returns its Task."""

    @overload
    def __call__(self, func: Callable[[JobContext, M], object], /) -> Task[M]: ...
    @overload
    def __call__(self, func: Callable[[JobContext], object], /) -> Task[dict[str, Any]]: ...
    @overload
    def __call__(self, func: Task[P], /) -> Task[P]: ...


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
    payload_model: builtins.type[BaseModel] | None = None
    """a typed handler's model: ``func`` validates the payload through it"""
    target: Callable[..., Any] | None = None
    """the decorated function, when ``func`` wraps it (a typed handler)"""

    @property
    def import_ref(self) -> str | None:
        """``module:qualname`` of what a child process calls with the context, if it
        can import it: the Task the module holds (its wrapper), else the function."""
        func = self.target or self.func
        module = getattr(func, "__module__", None)
        qualname = getattr(func, "__qualname__", "")
        if not module or module == "__main__" or "<locals>" in qualname:
            return None
        found: Any = sys.modules.get(module)
        for part in qualname.split("."):
            found = getattr(found, part, None)
        if isinstance(found, Task) and found.func is func:
            return f"{module}:{qualname}.{RUN_ATTRIBUTE}"
        if self.target is not None:
            return None  # the module's name is the bare function: it needs its payload
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
        known = self._specs.get(spec.type)
        if known is not None and (known.target or known.func) is not (spec.target or spec.func):
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
) -> Register:
    """Register the decorated function as the handler of ``type``; return its ``Task``.

    The function takes the JobContext, and returns a JSON object or None (the job's
    report). A second parameter annotated with a pydantic model makes it typed: it
    receives the payload validated through the model, and ``Task.enqueue`` takes that
    model (docs/tasks.md). It may be async (run in the daemon's event loop), or sync
    (run in a handler process of the daemon's: ``isolation``).
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

    def register(decorated: Callable[..., Any]) -> Task[Any]:
        func = decorated.func if isinstance(decorated, Task) else decorated
        model = _payload_model(type, func)
        is_async = inspect.iscoroutinefunction(func)
        run = func if model is None else _typed_runner(type, func, model, is_async)
        (registry or default_registry).add(
            HandlerSpec(
                type=type,
                func=run,
                is_async=is_async,
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
                payload_model=model,
                target=None if model is None else func,
            )
        )
        return Task(type, func, run, model)

    return register


def _payload_model(type: str, func: Callable[..., Any]) -> builtins.type[BaseModel] | None:
    """Return the model a handler takes its payload as, None for a handler of the
    context alone; ConfigError for a second parameter that is not a model."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): the context alone
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in parameters if p.kind in positional and p.default is p.empty]
    if len(required) < 2:
        return None
    usage = "a handler takes the JobContext, then, optionally, its payload as a pydantic model"
    if len(required) > 2:
        raise ConfigError(f"handler of {type!r} takes {len(required)} arguments: {usage}")
    name = required[1].name
    annotation = required[1].annotation
    if isinstance(annotation, str):  # ``from __future__ import annotations``
        # this one annotation, as get_type_hints would: the others (the context's, the
        # return's) may name what is imported for type checkers only
        namespace = dict(getattr(inspect.unwrap(func), "__globals__", {}))
        try:
            annotation = eval(annotation, namespace)
        except Exception as exc:  # NameError and kin: anything the annotation's eval raised
            raise ConfigError(
                f"handler of {type!r}: cannot resolve the annotation of {name!r} "
                f"({exc}): define its model at module level"
            ) from None
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if not (isinstance(annotation, builtins.type) and issubclass(annotation, BaseModel)):
        raise ConfigError(
            f"handler of {type!r}: {name!r} must be annotated with a pydantic model ({usage})"
        )
    return annotation


def _typed_runner(
    type: str, func: Callable[..., Any], model: builtins.type[BaseModel], is_async: bool
) -> HandlerFunc:
    """Return what the daemon calls for a typed handler: ``func(ctx, payload)``, the
    payload validated through ``model`` first (PayloadMismatch, never retried)."""
    if is_async:

        async def run_async(ctx: JobContext) -> Any:
            return await func(ctx, decode_payload(type, model, ctx.payload))

        return run_async

    def run(ctx: JobContext) -> Any:
        return func(ctx, decode_payload(type, model, ctx.payload))

    return run
