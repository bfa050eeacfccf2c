"""qa.stats.intervals: the one interval of delta at any level, and its p-values."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from qa.stats.intervals import delta_interval, is_degenerate, p_above, p_below, p_two_sided
from tests.qa.stats_fixtures import continuous, est_of


def test_stored_intervals_are_the_function_at_90_and_95() -> None:
    for e in (est_of(*continuous(80, seed=1)), est_of([1, 0, 1, 1] * 30, [1, 0, 0, 1] * 30)):
        assert delta_interval(e, 0.90) == e.ci90 and delta_interval(e, 0.95) == e.ci95


def test_t_interval_at_any_level_matches_scipy() -> None:
    a, b = continuous(120, seed=3, shift=-0.01)
    e = est_of(a, b)
    for level in (0.8, 0.9, 0.98):
        ref = stats.ttest_rel(b, a).confidence_interval(level)
        ci = delta_interval(e, level)
        assert (ci.lower, ci.upper) == pytest.approx((ref.low, ref.high))


def test_all_zero_differences_use_the_binomial_bound() -> None:
    a = np.linspace(0.05, 0.95, 400)  # non-binary scores, candidate identical on every item
    e = est_of(a, a.copy())
    h = 1 - 0.05 ** (1 / 400)
    assert e.ci_method == "degenerate"
    assert (e.ci90.lower, e.ci90.upper) == pytest.approx((-h, h))
    assert any("every paired difference is 0" in n for n in e.notes)
    assert p_two_sided(e) == 1.0


def test_degenerate_p_values_invert_the_bound() -> None:
    a = np.linspace(0.25, 0.75, 50)
    e = est_of(a, a - 0.25)  # exact constant drop
    assert e.ci_method == "degenerate"
    p = p_below(e, -0.1)  # the bound's upper limit lies below -0.1 at one-sided level p
    assert p == pytest.approx((1 - (0.15 / 1.25)) ** 50)
    ci = delta_interval(e, 1 - 2 * p)
    assert ci.upper == pytest.approx(-0.1)
    assert p_above(e, -0.1) == 1.0


def test_is_degenerate_ignores_float_noise_only() -> None:
    a = np.linspace(0.1, 0.9, 100)
    assert is_degenerate((a - 0.01) - a, 1.0)
    assert not is_degenerate(np.array([0.0, 0.0, 1e-6]), 1.0)
