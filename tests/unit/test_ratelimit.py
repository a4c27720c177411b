"""Submissions per token: the token bucket with an injected clock, and its setting.

The 429 answer of the API is tested in tests/http/test_http_ratelimit.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from support.clock import FakeClock

from jobsd.http.ratelimit import Rate, SubmitLimiter
from jobsd.http.settings import HttpSettings


@pytest.mark.parametrize(
    ("text", "count", "unit_s", "canonical"),
    [("20/s", 20, 1.0, "20/s"), ("600/m", 600, 60.0, "600/m"), (" 5 / hour ", 5, 3600.0, "5/h")],
)
def test_rates_parse(text: str, count: int, unit_s: float, canonical: str) -> None:
    rate = Rate.parse(text)
    assert (rate.count, rate.unit_s, rate.text) == (count, unit_s, canonical)


@pytest.mark.parametrize("text", ["0/s", "20", "20/d", "-1/s", "1.5/s", "fast"])
def test_bad_rates_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a rate"):
        Rate.parse(text)
    with pytest.raises(ValidationError):
        HttpSettings(submit_rate=text)


def test_the_submit_rate_is_on_by_default_and_can_be_switched_off() -> None:
    assert HttpSettings().submit_rate_limit() == Rate(1000, 1.0, "1000/s")  # on by default
    assert HttpSettings(submit_rate="off").submit_rate_limit() is None
    assert HttpSettings(submit_rate="600/m").submit_rate_limit() == Rate(600, 60.0, "600/m")


def test_bucket_allows_a_burst_then_the_refill_rate() -> None:
    clock = FakeClock()
    limiter = SubmitLimiter(Rate.parse("3/s"), clock=clock)
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = limiter.take("a")
    assert wait == pytest.approx(1 / 3)
    assert limiter.retry_after_s(wait) == 1
    assert limiter.take("b") == 0.0  # buckets are per key
    clock.now += 1 / 3
    assert limiter.take("a") == 0.0  # one token came back
    assert limiter.take("a") > 0
    clock.now += 3600
    takes = [limiter.take("a") for _ in range(4)]
    assert takes[:3] == [0.0, 0.0, 0.0] and takes[3] > 0  # full after a long idle, never more


def test_slow_rates_say_how_long_to_wait() -> None:
    clock = FakeClock()
    limiter = SubmitLimiter(Rate.parse("2/m"), clock=clock)
    assert limiter.take("a") == limiter.take("a") == 0.0
    wait = limiter.take("a")
    assert wait == pytest.approx(30.0)
    assert limiter.retry_after_s(wait) == 30
    clock.now += 29.5
    assert limiter.retry_after_s(limiter.take("a")) == 1  # refused tries take nothing
