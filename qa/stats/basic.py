"""Building blocks: means with (cluster-robust) SEs, t and Wilson intervals, flips and agreement shares.

Sources: E. Miller, "Adding Error Bars to Evals" (arXiv 2411.00640), eq. 4 for CR1 cluster SEs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from qa.files.comparison import AgreementShare, Flips, Interval


def wilson_bounds(k: float, n: float, conf: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a share k/n (k, n may be effective, non-integer counts), clipped to [0, 1]:
    (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), z = Phi^-1(1 - (1-conf)/2) (Wilson 1927;
    statsmodels' proportion_confint(method="wilson"), checked against it in the tests)."""
    z = float(stats.norm.isf((1 - conf) / 2))
    p, z2 = k / n, z * z
    denom = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)  # clip float noise at 0 and 1


def wilson(k: int, n: int, conf: float = 0.95) -> Interval:
    """Wilson score interval for a binomial share k/n ([0, 1] when n = 0)."""
    if n == 0:
        return Interval(lower=0.0, upper=1.0)
    lo, hi = wilson_bounds(k, n, conf)
    return Interval(lower=lo, upper=hi)


def cluster_mean_se(x: np.ndarray, clusters: Sequence[str] | np.ndarray | None) -> tuple[float, float | None, int]:
    """(mean, SE, df) of x (n,). Without clusters (or all distinct): sd(x, ddof=1)/sqrt(n), df = n-1.
    With clusters (n,): CR1, SE^2 = G/(G-1) * sum_g (sum_{i in g} (x_i - mean))^2 / n^2, df = G-1
    (the intercept-only case of Stata's CR1 / statsmodels cov_type="cluster"; Miller 2024, eq. 4).
    SE is None when undefined (n < 2, or G < 2)."""
    n = len(x)
    mean = float(np.mean(x)) if n else math.nan
    g = None
    if clusters is not None:
        _, g = np.unique(np.asarray(clusters), return_inverse=True)
    if g is None or int(g.max(initial=-1)) + 1 == n:
        if n < 2:
            return mean, None, 0
        return mean, float(np.std(x, ddof=1) / math.sqrt(n)), n - 1
    n_groups = int(g.max()) + 1
    if n_groups < 2:
        return mean, None, 0
    s = np.bincount(g, weights=x - mean, minlength=n_groups)  # (G,) cluster sums of residuals
    var = n_groups / (n_groups - 1) * float(np.sum(s**2)) / n**2
    return mean, math.sqrt(var), n_groups - 1


def gate_mean_se(x: np.ndarray, clusters: Sequence[str] | np.ndarray | None) -> tuple[float, float | None, int, bool]:
    """(mean, SE, df, floored) a decision reads: `cluster_mean_se`, except that a clustered SE is never
    below the item-level one, sd(x, ddof=1)/sqrt(n) (`floored` says it was raised; df stays G - 1).
    With few clusters CR1 can be arbitrarily small, and exactly 0 when every cluster's mean equals the
    others' (2 sessions with one flip each): a CI of width 0 around a non-zero difference. Taking the
    larger of the two follows Angrist & Pischke, Mostly Harmless Econometrics (2009), section 8.2."""
    mean, se, df = cluster_mean_se(x, clusters)
    if se is None or len(x) < 2 or clusters is None or len(np.unique(np.asarray(clusters))) == len(x):
        return mean, se, df, False
    item_se = float(np.std(x, ddof=1) / math.sqrt(len(x)))
    return (mean, item_se, df, True) if item_se > se else (mean, se, df, False)


def t_interval(est: float, se: float, df: int, conf: float) -> Interval:
    """est -/+ t_{df, (1+conf)/2} * se: the one t interval (of delta, the reference-answer and distribution
    means, the cache KL)."""
    h = float(stats.t.ppf((1 + conf) / 2, df)) * se
    return Interval(lower=est - h, upper=est + h)


def share(mask: np.ndarray | None) -> AgreementShare | None:
    """Share of True in a boolean mask (m,) with its Wilson 95% interval; None for no mask."""
    if mask is None:
        return None
    k, n = int(mask.sum()), int(mask.size)
    return AgreementShare(n=n, agree=k, share=k / n if n else 0.0, ci95=wilson(k, n))


def flips(pair_base: np.ndarray, pair_cand: np.ndarray, higher_is_better: bool = True) -> Flips:
    """(item, repeat) pairs whose score differs, both directions, with Wilson 95% intervals; n10 counts the
    baseline better (higher, or lower when not `higher_is_better`), n01 the candidate better."""
    n = int(pair_base.size)
    higher, lower = int(np.sum(pair_base > pair_cand)), int(np.sum(pair_cand > pair_base))
    n10, n01 = (higher, lower) if higher_is_better else (lower, higher)
    return Flips(
        n=n, n10=n10, n01=n01,
        rate=(n10 + n01) / n if n else 0.0, ci95=wilson(n10 + n01, n),
        regress_rate=n10 / n if n else 0.0, regress_ci95=wilson(n10, n),
        improve_rate=n01 / n if n else 0.0, improve_ci95=wilson(n01, n),
    )
