"""The one place that computes the interval of delta = candidate - baseline at any level, and the
one-sided p-values that go with it, from an Estimate's stored numbers.

`qa.compare.estimate` uses it to store the 90% and 95% intervals; the gate uses it at the policy's
level (1 - 2 alpha), so a re-gate under another alpha gets the interval the same method gives there.

Methods: `paired_t` / `cluster_cr1_t` (delta -/+ t_df SE), `tango_score` (binary, one repeat, few
discordant items), and `degenerate`: every paired difference equals one value c (SE 0, or float
noise below DEGENERATE_RTOL). Then the data say nothing about how much other items could differ, so
the interval is the exact binomial bound on the share of items that could differ from c when 0 of n
are seen to, 1 - a^(1/n) at one-sided level a, times the largest possible deviation from c within
the score range [-range, +range] of a difference. This is honest for c = 0 and c != 0 alike (a
point interval at c would pass a constant 1-point drop at any margin above it).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from qa.files.comparison import Estimate, Interval
from qa.stats.basic import t_interval
from qa.stats.paired_tests import tango_interval, tango_p_greater

DEGENERATE_RTOL = 1e-12  # differences equal to within this share of the score range are one value


def is_degenerate(d: np.ndarray, score_range: float) -> bool:
    """True when every paired difference d (n,) is the same value up to float noise."""
    return len(d) > 0 and float(np.ptp(d)) <= DEGENERATE_RTOL * score_range


def differing_share_bound(n: int, one_sided: float) -> float:
    """Upper limit of the share of items that differ when 0 of n do: 1 - a^(1/n) (Clopper-Pearson)."""
    return 1.0 - one_sided ** (1.0 / n)


def degenerate_interval(c: float, n: int, score_range: float, level: float) -> Interval:
    """Two-sided `level` bound for delta when all n differences equal c (see the module docstring)."""
    p = differing_share_bound(n, (1 - level) / 2)
    return Interval(lower=c - p * (c + score_range), upper=c + p * (score_range - c))


def delta_interval(est: Estimate, level: float) -> Interval | None:
    """The two-sided `level` interval of delta by the estimate's method; None when undefined."""
    if est.delta is None or est.n == 0:
        return None
    if est.ci_method == "degenerate":
        return degenerate_interval(est.delta, est.n, est.score_range, level)
    if est.ci_method == "tango_score" and (signs := est.items_by_sign()) is not None:
        return tango_interval(*signs, est.n, level)
    if est.se_paired is None or est.df is None or est.df < 1:
        return None
    return t_interval(est.delta, est.se_paired, est.df, level)


def _degenerate_p_below(c: float, n: int, score_range: float, delta0: float) -> float:
    # smallest one-sided level at which the bound's upper limit lies below delta0
    if delta0 <= c:
        return 1.0
    share = min(1.0, (delta0 - c) / (score_range - c)) if score_range > c else 1.0
    return (1.0 - share) ** n


def p_below(est: Estimate, delta0: float) -> float | None:
    """One-sided p for H0: delta >= delta0 against H1: delta < delta0 (e.g. delta0 = -margin: the
    "demonstrably worse" test); None when undefined."""
    if est.delta is None or est.n == 0:
        return None
    if est.ci_method == "degenerate":
        return _degenerate_p_below(est.delta, est.n, est.score_range, delta0)
    if est.ci_method == "tango_score" and (signs := est.items_by_sign()) is not None:
        return 1.0 - tango_p_greater(*signs, est.n, delta0)
    if est.se_paired is None or est.df is None or est.df < 1 or est.se_paired == 0:
        return None
    return float(stats.t.cdf((est.delta - delta0) / est.se_paired, est.df))


def p_above(est: Estimate, delta0: float) -> float | None:
    """One-sided p for H0: delta <= delta0 against H1: delta > delta0; None when undefined."""
    if est.delta is None or est.n == 0:
        return None
    if est.ci_method == "degenerate":
        return _degenerate_p_below(-est.delta, est.n, est.score_range, -delta0)
    if est.ci_method == "tango_score" and (signs := est.items_by_sign()) is not None:
        return tango_p_greater(*signs, est.n, delta0)
    if est.se_paired is None or est.df is None or est.df < 1 or est.se_paired == 0:
        return None
    return float(stats.t.sf((est.delta - delta0) / est.se_paired, est.df))


def p_two_sided(est: Estimate) -> float | None:
    """Two-sided p for H0: delta = 0 (2 x the smaller one-sided p, at most 1)."""
    lo, hi = p_below(est, 0.0), p_above(est, 0.0)
    if lo is None or hi is None:
        return None
    return min(1.0, 2 * min(lo, hi)) if math.isfinite(lo) and math.isfinite(hi) else None
