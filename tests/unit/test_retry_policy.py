"""Retry policies: back-off bounds (hypothesis) and what a policy accepts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import jobsd
from jobsd.errors import ConfigError
from jobsd.registry import Registry


@given(
    base_s=st.floats(0, 3600),
    factor=st.floats(1, 10),
    max_s=st.floats(0, 86_400),
    jitter=st.floats(0, 1),
    attempt=st.integers(1, 100_000),
)
def test_exponential_backoff_stays_within_its_bounds(
    base_s: float, factor: float, max_s: float, jitter: float, attempt: int
) -> None:
    delay = jobsd.exponential_backoff(base_s, factor=factor, max_s=max_s, jitter=jitter)(attempt)
    try:
        ideal = min(max_s, base_s * factor ** (attempt - 1))
    except OverflowError:
        ideal = max_s
    assert 0.0 <= delay <= max_s
    assert (1 - jitter) * ideal - 1e-9 <= delay <= ideal + 1e-9


@given(attempt=st.integers(1, 25), jitter=st.floats(0, 0.5))
def test_exponential_backoff_never_shrinks_by_more_than_its_jitter(
    attempt: int, jitter: float
) -> None:
    backoff = jobsd.exponential_backoff(1.0, max_s=1e9, jitter=jitter)
    # the next attempt waits at least the floor of twice this one's ideal delay
    assert backoff(attempt + 1) >= (1 - jitter) * 2**attempt - 1e-6


@given(seconds=st.floats(0, 1e6), attempt=st.integers(1, 1000))
def test_a_fixed_backoff_is_that_many_seconds(seconds: float, attempt: int) -> None:
    assert jobsd.RetryPolicy(3, backoff=seconds).delay_s(attempt) == seconds


def test_a_callable_backoff_is_never_negative() -> None:
    assert jobsd.RetryPolicy(2, backoff=lambda attempt: -5.0).delay_s(1) == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"backoff": -1},
        {"backoff": "soon"},
        {"retry_on": ()},
        {"retry_on": ("OSError",)},
    ],
)
def test_a_bad_policy_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        jobsd.RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_the_policy_gives_the_type_its_max_attempts_once() -> None:
    registry = Registry()

    @jobsd.handler("a", retry=jobsd.RetryPolicy(4), registry=registry)
    def a(ctx: jobsd.JobContext) -> None: ...

    spec = registry.get("a")
    assert spec is not None and spec.max_attempts == 4
    with pytest.raises(ConfigError, match="differs"):
        jobsd.handler("b", max_attempts=2, retry=jobsd.RetryPolicy(4), registry=registry)
