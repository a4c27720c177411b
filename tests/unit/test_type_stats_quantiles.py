"""Run-duration percentiles from the log-spaced buckets of jobsd.type_stats, and how the
type pages say their figures."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobsd.http.ui.types_page import duration, percent, rate
from jobsd.ops.type_stats import TOP_BUCKET, Window, bucket_bounds, percentile


def test_bucket_bounds_are_two_per_doubling_from_a_millisecond() -> None:
    assert bucket_bounds(0) == (0.0, 0.001)
    assert bucket_bounds(1) == (0.001, pytest.approx(0.001 * math.sqrt(2)))
    assert bucket_bounds(3) == (pytest.approx(0.002), pytest.approx(0.002 * math.sqrt(2)))
    assert bucket_bounds(21) == (pytest.approx(1.024), pytest.approx(1.024 * math.sqrt(2)))
    low, high = bucket_bounds(TOP_BUCKET)
    assert low == pytest.approx(2**31 / 1000) and high == math.inf
    for k in range(1, TOP_BUCKET):
        assert bucket_bounds(k)[1] == pytest.approx(bucket_bounds(k + 1)[0])
    for bad in (-1, 64):
        with pytest.raises(ValueError, match="no run-duration bucket"):
            bucket_bounds(bad)


@pytest.mark.parametrize(
    ("histogram", "q", "want"),
    [
        ({}, 0.5, None),
        ({-1: 7}, 0.5, None),  # cancelled before they ran: no duration
        ({0: 2}, 0.5, 0.0005),  # linear in bucket 0: half way
        ({0: 1}, 1.0, 0.001),
        ({3: 1}, 0.5, 0.002 * 2**0.25),  # geometric: the middle of [2, 2.83) ms
        ({3: 4}, 1.0, 0.002 * 2**0.5),
        ({1: 50, 21: 50}, 0.5, 0.001 * 2**0.5),  # the rank falls at the end of bucket 1
        ({1: 50, 21: 50}, 0.95, 1.024 * 2 ** (0.5 * 0.9)),
        ({-1: 100, 21: 1}, 0.5, 1.024 * 2**0.25),  # -1 is not a run
        ({TOP_BUCKET: 3}, 0.5, 2**31 / 1000),  # the open bucket gives its low bound
    ],
)
def test_percentile(histogram: dict[int, int], q: float, want: float | None) -> None:
    assert percentile(histogram, q) == (None if want is None else pytest.approx(want))


def test_percentile_refuses_a_quantile_outside_0_1() -> None:
    for q in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="a quantile is in"):
            percentile({3: 1}, q)


@given(
    st.dictionaries(st.integers(0, TOP_BUCKET), st.integers(1, 1000), min_size=1),
    st.floats(0.01, 1.0),
    st.floats(0.01, 1.0),
)
def test_percentiles_grow_with_q_and_stay_in_the_counted_buckets(
    histogram: dict[int, int], q1: float, q2: float
) -> None:
    low_q, high_q = sorted((q1, q2))
    a, b = percentile(histogram, low_q), percentile(histogram, high_q)
    assert a is not None and b is not None and a <= b * (1 + 1e-12)
    assert bucket_bounds(min(histogram))[0] <= a
    top = max(histogram)
    assert b <= (bucket_bounds(top)[0] if top == TOP_BUCKET else bucket_bounds(top)[1])


def test_a_window_says_rates_and_shares() -> None:
    w = Window(60, succeeded=50, failed=9, cancelled=1, run_s=30.0, histogram={-1: 1, 21: 59})
    assert w.finished == 60 and w.runs == 59
    assert w.per_minute == 1.0 and w.per_hour == 60.0
    assert w.failure_rate == pytest.approx(0.15)
    assert w.mean_s == pytest.approx(30 / 59)
    empty = Window(1440)
    assert (empty.failure_rate, empty.mean_s, empty.p50_s, empty.per_hour) == (
        None,
        None,
        None,
        0.0,
    )


def test_the_pages_say_durations_shares_and_rates() -> None:
    assert [duration(s) for s in (None, 0.0004, 0.0123, 0.85, 2.54, 42.0, 720.0)] == [
        "\N{EN DASH}",
        "0.4 ms",
        "12 ms",
        "850 ms",
        "2.5 s",
        "42 s",
        "12 min",
    ]
    assert [percent(s) for s in (None, 0.0, 0.004, 0.0567, 0.5)] == [
        "\N{EN DASH}",
        "0 %",
        "0.4 %",
        "5.7 %",
        "50 %",
    ]
    assert [rate(r) for r in (0.0, 0.0167, 1.25, 66.4)] == ["0", "0.02", "1.2", "66"]
