"""Tests on paired items: McNemar (exact and mid-p) on the items whose score differs, and Tango's
score interval and test for a difference of paired proportions.

Sources: Fagerland, Lydersen & Laake (2013) for McNemar mid-p; Tango (1998) and Fagerland, Lydersen &
Laake (2014) for the paired-proportions score interval.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats

from qa.files.comparison import Interval, McNemar

Z_EPS = 1e-12  # keeps Tango's statistic off the +-1 boundary, where its variance is 0


def mcnemar(n10: int, n01: int, repeats: int = 1) -> McNemar:
    """Exact McNemar (two-sided binomial on the discordant items, scipy binomtest) and its mid-p:
    mid-p = exact - P(X = n10), X ~ Bin(n10 + n01, 1/2) (Fagerland, Lydersen & Laake 2013, eq. 5).
    Counts are *items* (n10: baseline item mean better, n01: candidate better). With one repeat this is
    McNemar's test; with K > 1 repeats the same exact test on items is the sign test of the item-mean
    differences (treating (item, repeat) pairs as independent would inflate its size, 19.6% at a
    nominal 5% with K = 8). Convention: no discordant items, or n10 == n01, gives p = 1 for both."""
    method = "mcnemar" if repeats <= 1 else "sign_test_items"
    m = n10 + n01
    if m == 0 or n10 == n01:
        return McNemar(n10=n10, n01=n01, p_exact=1.0, p_midp=1.0, unit="item", method=method)
    p_exact = float(stats.binomtest(n10, m, 0.5).pvalue)
    p_mid = float(min(1.0, 2 * stats.binom.cdf(min(n10, n01), m, 0.5)) - stats.binom.pmf(n10, m, 0.5))
    return McNemar(n10=n10, n01=n01, p_exact=p_exact, p_midp=p_mid, unit="item", method=method)


def discordant_items(d: np.ndarray) -> tuple[int, int]:
    """(n10, n01): items whose difference d (n,) = candidate - baseline is negative, positive."""
    return int(np.sum(d < 0)), int(np.sum(d > 0))


def tango_constrained_p21(n12: int, n21: int, n: int, delta0: float) -> float:
    """Constrained MLE of p21 under delta = p12 - p21 = delta0 (Tango 1998; Fagerland et al. 2014,
    eq. 9): (sqrt(B^2 - 4AC) - B) / (2A), A = 2n, B = -n12 - n21 + (2n - n12 + n21) delta0,
    C = -n21 delta0 (1 - delta0)."""
    a = 2.0 * n
    b = -n12 - n21 + (2.0 * n - n12 + n21) * delta0
    c = -n21 * delta0 * (1 - delta0)
    return (math.sqrt(max(b * b - 4 * a * c, 0.0)) - b) / (2 * a)


def tango_statistic(n12: int, n21: int, n: int, delta0: float) -> float:
    """Tango's score statistic for H0: p12 - p21 = delta0,
    T = (n12 - n21 - n delta0) / sqrt(n (2 p21~ + delta0 (1 - delta0))); at delta0 = 0 it is the
    McNemar z. With the candidate as the first arm, n12 = n01 and delta = candidate - baseline."""
    p21 = tango_constrained_p21(n12, n21, n, delta0)
    var = n * (2 * p21 + delta0 * (1 - delta0))
    num = n12 - n21 - n * delta0
    if var <= 0:
        return 0.0 if num == 0 else math.copysign(math.inf, num)
    return num / math.sqrt(var)


def tango_interval(n01: int, n10: int, n: int, conf: float) -> Interval:
    """Tango score interval for delta = candidate - baseline = (n01 - n10)/n: every delta0 with
    |T(delta0)| < z_{(1+conf)/2}; T decreases in delta0, so each limit is one root (brentq)."""
    z = float(stats.norm.ppf((1 + conf) / 2))
    est = (n01 - n10) / n
    lo_end, hi_end = -1 + Z_EPS, 1 - Z_EPS
    # T is exactly 0 at the estimate only when there are discordant pairs; nudge off a 0/0.
    lo_start, hi_start = max(est - 1e-9, lo_end), min(est + 1e-9, hi_end)

    def f(d: float, target: float) -> float:
        return tango_statistic(n01, n10, n, d) - target

    lower = -1.0 if f(lo_end, z) < 0 else optimize.brentq(f, lo_end, lo_start, args=(z,), xtol=1e-12)
    upper = 1.0 if f(hi_end, -z) > 0 else optimize.brentq(f, hi_start, hi_end, args=(-z,), xtol=1e-12)
    return Interval(lower=float(lower), upper=float(upper))


def tango_p_greater(n01: int, n10: int, n: int, delta0: float) -> float:
    """One-sided score-test p for H0: delta <= delta0 vs H1: delta > delta0 (1 - Phi(T(delta0)))."""
    return float(stats.norm.sf(tango_statistic(n01, n10, n, delta0)))
