"""Power formulas (Miller 2024, "Adding Error Bars to Evals", sections 4-5): the minimum detectable
effect, and the items or repeats a paired design needs for MDE <= margin. One formula each, used by
comparison estimates, the gate and `qa plan` alike. Units are the metric's (0.02 = 2 points).
"""

from __future__ import annotations

import math

from scipy import stats

from qa.files.comparison import Estimate
from qa.stats.intervals import delta_interval, differing_share_bound


def z_total(alpha: float, power: float) -> float:
    """z_{1-alpha} + z_power: the MDE in SEs of a one-sided test at level alpha with that power."""
    return float(stats.norm.ppf(1 - alpha) + stats.norm.ppf(power))


def mde(est: Estimate, alpha: float, power: float) -> float | None:
    """Minimum detectable effect: (z_{1-alpha} + z_power) * SE_paired. For a degenerate estimate
    (every difference equal) power is not the limit, the exact bound is: the distance from delta to the
    lower limit of the (1 - 2 alpha) interval."""
    if est.ci_method == "degenerate" and est.delta is not None:
        ci = delta_interval(est, 1 - 2 * alpha)
        return None if ci is None else est.delta - ci.lower
    if est.se_paired is None:
        return None
    return z_total(alpha, power) * est.se_paired


def items_needed(sd_diff: float, margin: float, alpha: float, power: float, *, delta: float = 0.0,
                 score_range: float = 1.0) -> int | None:
    """Items for MDE <= margin: ceil(((z_{1-alpha} + z_power) * sd(d) / margin)^2), at least 2 (an SE
    needs two items). When sd(d) = 0 (every difference equals delta), the items for which the exact
    bound's lower limit clears -margin: n > ln(alpha) / ln(1 - (delta + margin) / (delta + range));
    None when no n can (delta <= -margin)."""
    if sd_diff > 0:
        return max(2, math.ceil((z_total(alpha, power) * sd_diff / margin) ** 2))
    room = (delta + margin) / (delta + score_range) if delta + score_range > 0 else 0.0
    if room <= 0:
        return None
    if room >= 1:
        return 2
    n = math.floor(math.log(alpha) / math.log(1 - room)) + 1
    while n > 1 and differing_share_bound(n - 1, alpha) < room:  # guard the float edge of the floor
        n -= 1
    return max(2, n)


def repeats_needed(sd_item: float, sd_within: float, k: int, n: int, margin: float, alpha: float,
                   power: float) -> int | None:
    """Repeats K' so that MDE <= margin at n items: Var(dbar_i) = tau^2 + sigma_w^2 / K with
    tau^2 = max(0, sd_item^2 - sigma_w^2 / K); needs K' >= sigma_w^2 / (n margin^2 / z^2 - tau^2)
    (Miller 2024, section 4). None when more repeats alone cannot reach the margin."""
    z = z_total(alpha, power)
    tau2 = max(0.0, sd_item**2 - sd_within**2 / k)
    room = n * margin**2 / z**2 - tau2
    if room <= 0:
        return None
    if sd_within == 0:
        return 1
    return max(1, math.ceil(sd_within**2 / room))
