"""qa.stats.basic: SEs (plain and CR1), Wilson intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from qa.stats.basic import cluster_mean_se, gate_mean_se, wilson


def test_unclustered_se_matches_scipy_sem() -> None:
    x = np.array([0.1, 0.4, 0.35, 0.8, 0.5])
    mean, se, df = cluster_mean_se(x, None)
    assert mean == pytest.approx(0.43)
    assert se == pytest.approx(stats.sem(x))
    assert df == 4


def test_cr1_se_matches_statsmodels_cluster_ols() -> None:
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(12), rng.integers(1, 6, 12))
    x = rng.normal(0, 1, len(groups)) + rng.normal(0, 1, 12)[groups]
    mean, se, df = cluster_mean_se(x, [f"g{g}" for g in groups])
    fit = sm.OLS(x, np.ones((len(x), 1))).fit(cov_type="cluster", cov_kwds={"groups": groups})
    assert mean == pytest.approx(fit.params[0])
    assert se == pytest.approx(fit.bse[0], rel=1e-10)
    assert df == 11


def test_a_decision_never_reads_a_clustered_se_below_the_item_level_one() -> None:
    # 2 sessions of 8 turns, one turn lost in each: the cluster means are equal, CR1 is 0
    x = np.zeros(16)
    x[[3, 11]] = -1.0
    clusters = ["s0"] * 8 + ["s1"] * 8
    assert cluster_mean_se(x, clusters)[1] == pytest.approx(0.0, abs=1e-15)
    mean, se, df, floored = gate_mean_se(x, clusters)
    assert (mean, df, floored) == (-0.125, 1, True) and se == pytest.approx(stats.sem(x))
    # clusters that share their shifts: CR1 above the item-level SE, kept as statsmodels computes it
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(12), 4)
    y = rng.normal(0, 0.2, len(groups)) + rng.normal(0, 1, 12)[groups]
    fit = sm.OLS(y, np.ones((len(y), 1))).fit(cov_type="cluster", cov_kwds={"groups": groups})
    assert gate_mean_se(y, [f"g{g}" for g in groups]) == pytest.approx((fit.params[0], fit.bse[0], 11, False))
    assert gate_mean_se(x, None)[1:] == pytest.approx((stats.sem(x), 15, False))


def test_cr1_hand_computed() -> None:
    # clusters {1, 3} and {2, 6}: mean 3, residual sums -2 and +2; SE^2 = 2/1 * 8 / 16 = 1
    mean, se, df = cluster_mean_se(np.array([1.0, 3.0, 2.0, 6.0]), ["a", "a", "b", "b"])
    assert (mean, se, df) == (3.0, 1.0, 1)


def test_wilson_matches_statsmodels_and_hand_formula() -> None:
    iv = wilson(7, 20)
    lo, hi = proportion_confint(7, 20, alpha=0.05, method="wilson")
    assert (iv.lower, iv.upper) == pytest.approx((lo, hi))
    z, p, n = stats.norm.ppf(0.975), 7 / 20, 20
    c = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    h = z / (1 + z**2 / n) * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    assert (iv.lower, iv.upper) == pytest.approx((c - h, c + h))
