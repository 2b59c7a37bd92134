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
