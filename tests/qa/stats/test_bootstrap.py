"""qa.stats.bootstrap: seeded paired BCa, against scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from qa.stats.bootstrap import bca_interval, bootstrap_delta


def test_bootstrap_is_seeded_and_close_to_t() -> None:
    rng = np.random.default_rng(0)
    d = rng.normal(-0.01, 0.2, 600)
    b1 = bootstrap_delta(d, None, 400, seed=7)
    b2 = bootstrap_delta(d, None, 400, seed=7)
    b3 = bootstrap_delta(d, None, 400, seed=8)
    assert b1 == b2 and b1.ci95 != b3.ci95
    assert b1.method == "BCa" and b1.unit == "item"
    se = stats.sem(d)
    assert b1.ci95.lower == pytest.approx(d.mean() - 1.96 * se, abs=0.4 * se)
    assert b1.ci95.upper == pytest.approx(d.mean() + 1.96 * se, abs=0.4 * se)
    assert b1.ci90.lower > b1.ci95.lower and b1.ci90.upper < b1.ci95.upper


def test_bca_matches_scipy_on_the_same_bootstrap_distribution() -> None:
    from types import SimpleNamespace

    rng = np.random.default_rng(4)
    d = rng.choice([-1.0, 0.0, 0.0, 0.0, 1.0], 150)
    theta_b = rng.choice(d, (999, d.size)).mean(axis=1)  # any bootstrap distribution will do
    ref = stats.bootstrap((d,), np.mean, n_resamples=0, method="BCa", confidence_level=0.9,
                          bootstrap_result=SimpleNamespace(bootstrap_distribution=theta_b))
    jack = (d.sum() - d) / (d.size - 1)
    ours = bca_interval(float(d.mean()), theta_b, jack, 0.9)
    ci = ref.confidence_interval
    assert (ours.lower, ours.upper) == pytest.approx((ci.low, ci.high), rel=1e-12)


def test_cluster_bootstrap_agrees_with_scipy_bca_on_cluster_sums() -> None:
    rng = np.random.default_rng(6)
    g = np.repeat(np.arange(15), rng.integers(1, 5, 15))
    d = rng.normal(-0.02, 0.3, len(g))
    ours = bootstrap_delta(d, [f"c{i}" for i in g], 5000, seed=3)
    sums, counts = np.bincount(g, weights=d), np.bincount(g).astype(float)
    ref = stats.bootstrap((sums, counts), lambda s, c, axis=-1: s.sum(axis) / c.sum(axis), paired=True,
                          vectorized=True, n_resamples=5000, method="BCa", random_state=np.random.default_rng(9))
    ci = ref.confidence_interval
    assert ours.unit == "cluster"
    width = ci.high - ci.low  # independent draws: agree to Monte Carlo error
    assert ours.ci95.lower == pytest.approx(ci.low, abs=0.1 * width)
    assert ours.ci95.upper == pytest.approx(ci.high, abs=0.1 * width)
