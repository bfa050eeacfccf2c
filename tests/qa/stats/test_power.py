"""qa.stats.power: MDE, items and repeats needed (Miller 2024), hand-computed."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from qa.stats.power import items_needed, mde, repeats_needed
from tests.qa.stats_fixtures import continuous, est_of

Z = stats.norm.ppf(0.95) + stats.norm.ppf(0.8)  # 2.4865


def test_items_and_repeats_needed_hand_computed() -> None:
    assert items_needed(0.3, 0.02, 0.05, 0.8) == math.ceil((Z * 0.3 / 0.02) ** 2)
    assert items_needed(1e-6, 0.02, 0.05, 0.8) == 2  # an SE needs two items
    # sd_item 0.3 at K = 1 with within sd 0.25: tau^2 = 0.09 - 0.0625; n = 2000, margin 0.02
    k = repeats_needed(0.3, 0.25, 1, 2000, 0.02, 0.05, 0.8)
    room = 2000 * 0.02**2 / Z**2 - (0.09 - 0.0625)
    assert k == math.ceil(0.0625 / room)
    assert repeats_needed(0.3, 0.1, 1, 100, 0.02, 0.05, 0.8) is None  # between-item variance alone too big


def test_items_needed_for_zero_sd_is_the_exact_bound() -> None:
    # every difference 0: the bound 1 - a^(1/n) must fall below the margin
    for alpha, margin in ((0.05, 0.02), (0.01, 0.01), (0.05, 0.05)):
        n = items_needed(0.0, margin, alpha, 0.8)
        assert 1 - alpha ** (1 / n) < margin <= 1 - alpha ** (1 / (n - 1))
    # a constant drop c: the lower limit c - p (c + 1) must clear -margin; c at -margin can never
    n = items_needed(0.0, 0.02, 0.05, 0.8, delta=-0.01)
    p = 1 - 0.05 ** (1 / n)
    assert -0.01 - p * 0.99 > -0.02
    assert items_needed(0.0, 0.02, 0.05, 0.8, delta=-0.02) is None


def test_mde_is_z_times_se_and_the_bound_when_degenerate() -> None:
    e = est_of(*continuous(30, seed=6, noise=0.3))
    assert mde(e, 0.05, 0.8) == pytest.approx(Z * e.se_paired)
    flat = est_of([0.2, 0.4, 0.6, 0.8] * 10, [0.2, 0.4, 0.6, 0.8] * 10)
    assert flat.ci_method == "degenerate"
    assert mde(flat, 0.05, 0.8) == pytest.approx(1 - 0.05 ** (1 / 40))
