"""Explicit retries: which errors, how many attempts, how long to wait.

A type without a policy never retries: a handler exception fails the job at once. With
one, an exception that matches ``retry_on`` (or a timeout, when ``TimeoutError`` is in
it) moves the job to ``scheduled`` with ``run_after = now + backoff`` while attempts
remain; anything else still fails at once. A payload that does not validate against
its typed handler's model (``PayloadMismatch``) never matches: the same payload
cannot do better.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from jobsd.errors import ConfigError, PayloadMismatch

__all__ = ["Backoff", "RetryPolicy", "exponential_backoff"]

_NEVER_RETRIED = f"{PayloadMismatch.__module__}.{PayloadMismatch.__qualname__}"

Backoff = Callable[[int], float]
"""Seconds to wait after a failed attempt (1 for the first run); never negative."""


def exponential_backoff(
    base_s: float = 1.0, *, factor: float = 2.0, max_s: float = 300.0, jitter: float = 0.2
) -> Backoff:
    """Return ``min(max_s, base_s * factor ** (attempt - 1))``, lowered by up to ``jitter``.

    The jitter spreads retries of jobs that failed together: the delay of attempt n lies
    in ``[(1 - jitter) * d, d]`` where d is the capped exponential.
    """
    if base_s < 0 or max_s < 0 or factor < 1 or not 0 <= jitter <= 1:
        raise ConfigError(
            "exponential_backoff needs base_s >= 0, max_s >= 0, factor >= 1, 0 <= jitter <= 1"
        )

    def delay(attempt: int) -> float:
        try:
            capped = min(max_s, base_s * factor ** max(attempt - 1, 0))
        except OverflowError:  # factor ** a large attempt: past any cap
            capped = max_s
        return capped * (1.0 - random.uniform(0.0, jitter))

    return delay


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry a type's known failures: ``retry=RetryPolicy(3, backoff=10, retry_on=(OSError,))``.

    ``max_attempts`` counts runs, the first included. ``backoff`` is seconds (a fixed
    delay) or a function of the attempt that just failed (``exponential_backoff()``,
    the default: 1 s, 2 s, 4 s ... up to 5 min, jittered).
    """

    max_attempts: int = 3
    backoff: float | Backoff = field(default_factory=exponential_backoff)
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError("RetryPolicy.max_attempts must be at least 1")
        if not isinstance(self.backoff, int | float) and not callable(self.backoff):
            raise ConfigError("RetryPolicy.backoff must be seconds or a function of the attempt")
        if isinstance(self.backoff, int | float) and self.backoff < 0:
            raise ConfigError("RetryPolicy.backoff must not be negative")
        if not self.retry_on or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in self.retry_on
        ):
            raise ConfigError("RetryPolicy.retry_on must be a tuple of exception types")

    def matches(self, exc: BaseException) -> bool:
        """Say whether ``exc`` is one of the errors this policy retries."""
        return isinstance(exc, self.retry_on) and not isinstance(exc, PayloadMismatch)

    def matches_names(self, mro: Sequence[str]) -> bool:
        """``matches`` for an error raised in a handler process, known by the
        ``module.qualname`` of its type and base types."""
        if _NEVER_RETRIED in mro:
            return False
        return any(f"{t.__module__}.{t.__qualname__}" in mro for t in self.retry_on)

    def delay_s(self, attempt: int) -> float:
        """Return the wait after ``attempt`` failed (seconds, never negative)."""
        if isinstance(self.backoff, int | float):
            return float(self.backoff)
        return max(0.0, float(self.backoff(attempt)))
