"""The 95% interval shared by the report and the benchmarks."""
import pytest

from evaluate.metrics import mean_interval, t95


def test_t_quantiles_are_conservative_between_listed_degrees_of_freedom():
    assert t95(1) == pytest.approx(12.706)
    assert t95(11) == t95(10) == pytest.approx(2.228)  # the next lower df: a wider interval
    assert t95(500) == 1.96


def test_mean_interval_of_three_values():
    mean, lo, hi = mean_interval([1.0, 2.0, 3.0])
    half = 4.303 * 1.0 / 3 ** 0.5
    assert (mean, lo, hi) == pytest.approx((2.0, 2.0 - half, 2.0 + half))


def test_one_value_has_no_interval():
    assert mean_interval([5.0]) is None


def test_median_interval_uses_the_binomial_ranks():
    from evaluate.metrics import median_interval
    # n = 10: P(B <= 1) = 11/1024 <= 2.5% < P(B <= 2) = 56/1024, so ranks 2 and 9 (1-based).
    values = [10.0, 1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 4.0, 6.0, 5.0]
    assert median_interval(values) == (5.5, 2.0, 9.0)
    # The largest value made wild moves nothing (the mean's interval grows with it).
    assert median_interval([1e6 if v == 10.0 else v for v in values]) == (5.5, 2.0, 9.0)
    assert median_interval([1.0] * 5) is None  # n = 5: even ranks 1 and 5 cover only 94%
    lo, hi = median_interval([float(i) for i in range(100)])[1:]
    assert (lo, hi) == (39.0, 60.0)  # ranks 40 and 61 for n = 100
