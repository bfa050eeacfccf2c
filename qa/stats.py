"""Paired statistics for one (task, metric, filter): SEs, intervals, the sigma rule,
non-inferiority and TOST, McNemar, flips, agreement, bootstrap, power; multiplicity across tasks.

Conventions (docs/STATISTICS.md): d_i = b_i - a_i = candidate - baseline per item, repeats averaged
per item and arm first; ddof = 1; t reference with n - 1 df, or G - 1 with CR1 cluster-robust SEs
when items share a cluster key; Tango's score interval for binary, single-repeat, unclustered data
with few discordant pairs; every random draw from `numpy.random.default_rng(seed)`.

Sources: E. Miller, "Adding Error Bars to Evals" (arXiv 2411.00640) for clustered SEs, paired
differences, repeats and power; Fagerland, Lydersen & Laake (2013, 2014) and Tango (1998) for
McNemar mid-p and the paired-proportions score interval; Berger (1982) for intersection-union.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from qa.comparison import (
    TOST,
    Agreement,
    AgreementShare,
    Bootstrap,
    CIMethod,
    Estimate,
    ExcessFlips,
    Flips,
    Interval,
    McNemar,
    Multiplicity,
    NonInferiority,
    SEBasis,
    SigmaRule,
    StatsConfig,
    Verdict,
)
from qa.pairing import PairedMetric, PairedTask, paired_metric

_Z_EPS = 1e-12  # keeps Tango's statistic off the +-1 boundary, where its variance is 0


# --------------------------------------------------------------------------- basic building blocks


def wilson(k: int, n: int, conf: float = 0.95) -> Interval:
    """Wilson score interval for a binomial share k/n (statsmodels proportion_confint)."""
    if n == 0:
        return Interval(lower=0.0, upper=1.0)
    lo, hi = proportion_confint(k, n, alpha=1 - conf, method="wilson")
    return Interval(lower=max(0.0, float(lo)), upper=min(1.0, float(hi)))  # clip float noise at 0 and 1


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
    G = int(g.max()) + 1
    if G < 2:
        return mean, None, 0
    s = np.bincount(g, weights=x - mean, minlength=G)  # (G,) cluster sums of residuals
    var = G / (G - 1) * float(np.sum(s**2)) / n**2
    return mean, math.sqrt(var), G - 1


def t_interval(est: float, se: float, df: int, conf: float) -> Interval:
    """est -/+ t_{df, (1+conf)/2} * se."""
    h = float(stats.t.ppf((1 + conf) / 2, df)) * se
    return Interval(lower=est - h, upper=est + h)


def mcnemar(n10: int, n01: int, unit: str = "item") -> McNemar:
    """Exact McNemar (two-sided binomial on the discordant pairs, scipy binomtest) and its mid-p:
    mid-p = exact - P(X = n10), X ~ Bin(n10 + n01, 1/2) (Fagerland, Lydersen & Laake 2013, eq. 5).
    Convention: no discordant pairs, or n10 == n01, gives p = 1 for both."""
    m = n10 + n01
    if m == 0 or n10 == n01:
        return McNemar(n10=n10, n01=n01, p_exact=1.0, p_midp=1.0, unit=unit)  # type: ignore[arg-type]
    p_exact = float(stats.binomtest(n10, m, 0.5).pvalue)
    p_mid = float(min(1.0, 2 * stats.binom.cdf(min(n10, n01), m, 0.5)) - stats.binom.pmf(n10, m, 0.5))
    return McNemar(n10=n10, n01=n01, p_exact=p_exact, p_midp=p_mid, unit=unit)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Tango score interval


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
    lo_end, hi_end = -1 + _Z_EPS, 1 - _Z_EPS
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


# --------------------------------------------------------------------------- decision pieces


def sigma_rule(delta: float, se_x: float | None, se_paired: float | None, k: float, basis: SEBasis) -> SigmaRule:
    """|delta| <= k * SE_basis, its false-alarm rate for an identical candidate,
    2 (1 - Phi(k SE_basis / SE_paired)), and the drop caught with 80% probability,
    k SE_basis + z_0.8 SE_paired (docs/STATISTICS.md section 1)."""
    if se_x is None:
        return SigmaRule(k=k, basis=basis, se=None, threshold=None, ratio=None, passed=None,
                         false_alarm_rate=None, drop_caught_80=None)
    far = drop = None
    if se_paired is not None and se_paired > 0:
        far = float(2 * stats.norm.sf(k * se_x / se_paired))
        drop = float(k * se_x + stats.norm.ppf(0.8) * se_paired)
    return SigmaRule(
        k=k,
        basis=basis,
        se=se_x,
        threshold=k * se_x,
        ratio=abs(delta) / se_x if se_x > 0 else None,
        passed=bool(abs(delta) <= k * se_x),
        false_alarm_rate=far,
        drop_caught_80=drop,
    )


def ni_verdict(ci: Interval, margin: float) -> Verdict:
    """Non-inferiority on the (1 - 2 alpha) CI: pass iff lower > -margin, fail iff upper < -margin."""
    if ci.lower > -margin:
        return "pass"
    if ci.upper < -margin:
        return "fail"
    return "inconclusive"


def tost_verdict(ci: Interval, margin: float) -> Verdict:
    """Equivalence on the (1 - 2 alpha) CI: pass iff inside (-margin, margin), fail iff wholly outside."""
    if -margin < ci.lower and ci.upper < margin:
        return "pass"
    if ci.upper < -margin or ci.lower > margin:
        return "fail"
    return "inconclusive"


def needed_items(sd_diff: float, margin: float, alpha: float, power: float) -> int:
    """n = ceil(((z_{1-alpha} + z_power) * sd(d) / margin)^2) (Miller 2024, section 5)."""
    z = stats.norm.ppf(1 - alpha) + stats.norm.ppf(power)
    return math.ceil((z * sd_diff / margin) ** 2)


def needed_repeats(
    sd_item: float, sd_within: float, k: int, n: int, margin: float, alpha: float, power: float
) -> int | None:
    """Repeats K' so that MDE <= margin at n items: Var(dbar_i) = tau^2 + sigma_w^2 / K with
    tau^2 = max(0, sd_item^2 - sigma_w^2 / K); needs K' >= sigma_w^2 / (n margin^2 / z^2 - tau^2)
    (Miller 2024, section 4). None when more repeats alone cannot reach the margin."""
    z = stats.norm.ppf(1 - alpha) + stats.norm.ppf(power)
    tau2 = max(0.0, sd_item**2 - sd_within**2 / k)
    room = n * margin**2 / z**2 - tau2
    if room <= 0:
        return None
    if sd_within == 0:
        return 1
    return max(1, math.ceil(sd_within**2 / room))


def bca_interval(theta_hat: float, theta_b: np.ndarray, theta_jack: np.ndarray, conf: float) -> Interval | None:
    """BCa interval from a bootstrap distribution (B,) and jackknife values (n,) (Efron & Tibshirani
    1993, eqs. 14.14-14.15, with scipy.stats.bootstrap's conventions: ties count half in z0,
    linear percentiles). None when the interval is undefined (constant jackknife or bootstrap)."""
    z0 = stats.norm.ppf((np.sum(theta_b < theta_hat) + np.sum(theta_b <= theta_hat)) / (2 * theta_b.size))
    dev = theta_jack.mean() - theta_jack  # (n,)
    den = 6 * float(np.sum(dev**2)) ** 1.5
    if den == 0 or not math.isfinite(z0):
        return None
    a = float(np.sum(dev**3)) / den
    z = stats.norm.ppf([(1 - conf) / 2, (1 + conf) / 2])
    levels = stats.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
    if not np.all(np.isfinite(levels)):
        return None
    lo, hi = np.percentile(theta_b, levels * 100)
    return Interval(lower=float(lo), upper=float(hi))


def bootstrap_delta(
    d: np.ndarray, clusters: Sequence[str] | None, n_resamples: int, seed: int
) -> Bootstrap:
    """Paired BCa bootstrap of mean(d) (d = candidate - baseline per item, both arms resampled
    together): resample items, or whole clusters (statistic = resampled clusters' sum of d / their
    item count), generator default_rng(seed). Written out rather than scipy.stats.bootstrap because
    scipy's BCa jackknife is O(n^2) (24 s for MMLU's 14k items); this one is O(n) for a ratio of sums
    and gives scipy's interval for the same bootstrap distribution (see the tests)."""
    unit = "cluster" if clusters is not None and len(set(clusters)) < len(d) else "item"
    if unit == "cluster":
        _, g = np.unique(np.asarray(clusters), return_inverse=True)
        sums = np.bincount(g, weights=d)  # (G,)
        counts = np.bincount(g).astype(np.float64)  # (G,)
    else:
        sums, counts = d.astype(np.float64), np.ones(len(d))
    if len(sums) < 3 or np.all(d == d[0]):
        v = float(np.mean(d)) if len(d) else 0.0
        ci = Interval(lower=v, upper=v) if len(d) else None
        return Bootstrap(n_resamples=n_resamples, seed=seed, unit=unit, method="degenerate", ci90=ci, ci95=ci)
    G = len(sums)
    S, C = float(sums.sum()), float(counts.sum())
    rng = np.random.default_rng(seed)
    theta_b = np.empty(n_resamples)
    step = max(1, 2**22 // G)  # resamples per batch: keeps the (batch, G) index array near 32 MB
    for lo in range(0, n_resamples, step):
        idx = rng.integers(0, G, size=(min(step, n_resamples - lo), G))  # (batch, G)
        theta_b[lo:lo + len(idx)] = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    theta_jack = (S - sums) / (C - counts)  # (G,) leave-one-cluster-out estimates
    theta_hat = S / C
    return Bootstrap(n_resamples=n_resamples, seed=seed, unit=unit, method="BCa",
                     ci90=bca_interval(theta_hat, theta_b, theta_jack, 0.90),
                     ci95=bca_interval(theta_hat, theta_b, theta_jack, 0.95))


def _share(mask: np.ndarray | None) -> AgreementShare | None:
    if mask is None:
        return None
    k, n = int(mask.sum()), int(mask.size)
    return AgreementShare(n=n, agree=k, share=k / n if n else 0.0, ci95=wilson(k, n))


def flips(pair_base: np.ndarray, pair_cand: np.ndarray) -> Flips:
    """Pairs whose score differs, both directions, with Wilson 95% intervals."""
    n = int(pair_base.size)
    n10 = int(np.sum(pair_base > pair_cand))
    n01 = int(np.sum(pair_cand > pair_base))
    return Flips(
        n=n, n10=n10, n01=n01,
        rate=(n10 + n01) / n if n else 0.0, ci95=wilson(n10 + n01, n),
        regress_rate=n10 / n if n else 0.0, regress_ci95=wilson(n10, n),
        improve_rate=n01 / n if n else 0.0, improve_ci95=wilson(n01, n),
    )


# --------------------------------------------------------------------------- one estimate


@dataclass(frozen=True)
class _Tests:
    """The interval method for delta, its intervals (decision level: 1 - 2 alpha) and p-values."""

    method: CIMethod
    ci90: Interval | None = None
    ci95: Interval | None = None
    ci_dec: Interval | None = None
    p_ni: float | None = None  # H0: delta <= -margin
    p_worse: float | None = None  # H0: delta >= -margin
    p_tost: float | None = None
    p_diff: float | None = None  # two-sided, H0: delta = 0
    note: str | None = None


def _t_tests(delta: float, se: float, df: int, margin: float, conf: float, method: CIMethod) -> _Tests:
    """Paired (or CR1 cluster) t: intervals delta -/+ t_df se and one-sided t p-values."""
    t_ni, t_up = (delta + margin) / se, (delta - margin) / se
    return _Tests(
        method=method,
        ci90=t_interval(delta, se, df, 0.90), ci95=t_interval(delta, se, df, 0.95),
        ci_dec=t_interval(delta, se, df, conf),
        p_ni=float(stats.t.sf(t_ni, df)), p_worse=float(stats.t.cdf(t_ni, df)),
        p_tost=max(float(stats.t.sf(t_ni, df)), float(stats.t.cdf(t_up, df))),
        p_diff=float(2 * stats.t.sf(abs(delta) / se, df)),
    )


def _tango_tests(n01: int, n10: int, n: int, margin: float, conf: float) -> _Tests:
    """Tango score intervals and score-test p-values (binary, one repeat, few discordant pairs)."""
    p_ni = tango_p_greater(n01, n10, n, -margin)
    return _Tests(
        method="tango_score",
        ci90=tango_interval(n01, n10, n, 0.90), ci95=tango_interval(n01, n10, n, 0.95),
        ci_dec=tango_interval(n01, n10, n, conf),
        p_ni=p_ni, p_worse=1 - p_ni,
        p_tost=max(p_ni, 1 - tango_p_greater(n01, n10, n, margin)),
        p_diff=1.0 if n01 + n10 == 0 else float(2 * stats.norm.sf(abs(tango_statistic(n01, n10, n, 0.0)))),
    )


def _degenerate_tests(delta: float, n: int, scale: float, margin: float, conf: float) -> _Tests:
    """Every paired difference equal (SE 0). All 0: the exact binomial bound on the share of items
    that could differ when 0 of n are seen to, 1 - a^(1/n) at one-sided level a, times the score
    range `scale`. All equal to c != 0: a point interval at c."""
    if delta == 0:
        def bound(level: float) -> Interval:
            h = (1 - ((1 - level) / 2) ** (1 / n)) * scale
            return Interval(lower=-h, upper=h)

        ci90, ci95, ci_dec = bound(0.90), bound(0.95), bound(conf)
        note = ("every paired difference is 0: intervals are the exact binomial bound on the share of "
                "items that could differ (0 of n observed), times the score range")
    else:
        ci90 = ci95 = ci_dec = Interval(lower=delta, upper=delta)
        note = f"every paired difference equals {delta:g}: the interval is a point"
    return _Tests(
        method="degenerate", ci90=ci90, ci95=ci95, ci_dec=ci_dec,
        p_ni=0.0 if ci_dec.lower > -margin else 1.0,
        p_worse=0.0 if ci_dec.upper < -margin else 1.0,
        p_tost=0.0 if -margin < ci_dec.lower and ci_dec.upper < margin else 1.0,
        p_diff=1.0 if delta == 0 else 0.0,
        note=note,
    )


def _within_sd(pm: PairedMetric) -> float | None:
    """Pooled within-item sd of the per-repeat differences (items with >= 2 repeats), ddof = 1."""
    if int(pm.repeats.max(initial=0)) < 2:
        return None
    d = pm.pair_cand - pm.pair_base
    mean_i = np.bincount(pm.pair_item, weights=d, minlength=len(pm.base)) / np.maximum(pm.repeats, 1)
    ss = np.bincount(pm.pair_item, weights=(d - mean_i[pm.pair_item]) ** 2, minlength=len(pm.base))
    dof = pm.repeats - 1
    use = dof > 0
    return float(math.sqrt(ss[use].sum() / dof[use].sum()))


def estimate(pm: PairedMetric, config: StatsConfig) -> Estimate:
    """All statistics of one (task, metric, filter), with `config`'s override for the task applied."""
    cfg = config.for_task(pm.task)
    margin, alpha = cfg.margin, cfg.alpha
    conf_decision = 1 - 2 * alpha
    z_pow = float(stats.norm.ppf(1 - alpha) + stats.norm.ppf(cfg.power))
    notes: list[str] = []
    n = len(pm.base)
    a, b = pm.base, pm.cand
    d = b - a  # (n,) candidate - baseline per item
    clustered = len(set(pm.clusters)) < n
    clusters = pm.clusters if clustered else None
    n_clusters = len(set(pm.clusters))
    repeats = int(pm.repeats.max(initial=0))
    mcn_unit = "item" if repeats <= 1 else "item_repeat"

    if n == 0:
        return _empty_estimate(pm, cfg, notes + ["no item has a score in both arms"])

    mean_a, se_a, _ = cluster_mean_se(a, clusters)
    mean_b, se_b, _ = cluster_mean_se(b, clusters)
    delta, se_p, df = cluster_mean_se(d, clusters)
    se_unp = math.sqrt(se_a**2 + se_b**2) if se_a is not None and se_b is not None else None
    sd_a, sd_b = (float(np.std(x, ddof=1)) if n > 1 else 0.0 for x in (a, b))
    rho = float(np.corrcoef(a, b)[0, 1]) if n > 1 and sd_a > 0 and sd_b > 0 else None
    sd_diff = se_p * math.sqrt(n) if se_p is not None else None
    se_basis = {"baseline": se_a, "unpaired": se_unp, "paired": se_p}[cfg.basis]

    # Degenerate data never passes silently: both arms pinned at one value, or the baseline at the
    # floor of a binary score (no regression is observable), carries no information.
    both_constant = sd_a == 0 and sd_b == 0 and mean_a == mean_b
    floor = pm.binary and sd_a == 0 and mean_a == 0.0
    information = n >= 2 and not (both_constant or floor)
    if both_constant and n >= 2:
        notes.append(
            f"no information: both arms score {mean_a:g} on every item, so every paired difference and SE "
            "is 0; the task cannot show a difference (use answer agreement, flips or KL instead)"
        )
    elif floor and n >= 2:
        notes.append("no information: the baseline scores 0 on every item, so no regression is observable")
    elif n < 2:
        notes.append("no information: only one item is scored in both arms")

    mcn = None
    n10 = int(np.sum(pm.pair_base > pm.pair_cand))
    n01 = int(np.sum(pm.pair_cand > pm.pair_base))
    if pm.binary:
        mcn = mcnemar(n10, n01, mcn_unit)
        if n10 == n01:
            notes.append("McNemar: n10 == n01, p = 1 by convention")
    flip = flips(pm.pair_base, pm.pair_cand)
    agreement = None
    if pm.extracted_same is not None or pm.completion_same is not None:
        agreement = Agreement(extracted=_share(pm.extracted_same), completion=_share(pm.completion_same))

    use_tango = pm.binary and repeats == 1 and not clustered and n10 + n01 < cfg.tango_max_discordant
    if se_p is None or df < 1:
        tests = _Tests(method="cluster_cr1_t" if clustered else "paired_t",
                       note=f"SE undefined ({'fewer than 2 clusters' if clustered else 'fewer than 2 items'})")
    elif use_tango:
        tests = _tango_tests(n01, n10, n, margin, conf_decision)
    elif se_p == 0:
        tests = _degenerate_tests(delta, n, max(1.0, float(np.max(np.abs(np.concatenate([a, b]))))), margin,
                                  conf_decision)
    else:
        tests = _t_tests(delta, se_p, df, margin, conf_decision, "cluster_cr1_t" if clustered else "paired_t")
    if tests.note:
        notes.append(tests.note)
    method, ci90, ci95, ci_dec = tests.method, tests.ci90, tests.ci95, tests.ci_dec

    # Power (docs/STATISTICS.md section 2): MDE = (z_{1-alpha} + z_power) * SE_paired.
    mde = n_needed = repeats_needed = None
    if se_p is not None:
        mde = z_pow * se_p
        if sd_diff is not None and sd_diff > 0:
            n_needed = needed_items(sd_diff, margin, alpha, cfg.power)
        else:
            # 0 differing items observed: items needed for the exact bound 1 - alpha^(1/n) <= margin.
            n_needed = math.ceil(math.log(alpha) / math.log(1 - margin))
        sd_w = _within_sd(pm)
        if sd_w is not None and not clustered and sd_diff is not None:
            repeats_needed = needed_repeats(sd_diff, sd_w, repeats, n, margin, alpha, cfg.power)

    ni_v: Verdict
    tost_v: Verdict
    if not information:
        ni_v = tost_v = "no_information"
    elif ci_dec is None:
        ni_v = tost_v = "inconclusive"
    else:
        ni_v, tost_v = ni_verdict(ci_dec, margin), tost_verdict(ci_dec, margin)
        if mde is not None and mde > margin:
            # docs/STATISTICS.md section 2: power is checked before deciding; only a demonstrated
            # failure survives an underpowered design.
            if ni_v != "fail":
                if ni_v == "pass":
                    notes.append(f"the CI alone would pass, but MDE {mde:.4f} > margin {margin:g}")
                ni_v = "underpowered"
            if tost_v != "fail":
                tost_v = "underpowered"
    if information and ci_dec is not None and ci_dec.lower > margin:
        notes.append("candidate better by more than the margin: check the harness and the served model")

    rule = sigma_rule(delta, se_basis, se_p, cfg.k, cfg.basis)
    if not information:
        rule = rule.model_copy(update={"passed": None})

    boot = None
    if cfg.bootstrap_n > 0:
        boot = bootstrap_delta(d, clusters, cfg.bootstrap_n, cfg.seed)

    return Estimate(
        task=pm.task, metric=pm.metric, filter=pm.filter, task_version=pm.task_version,
        binary=pm.binary, n=n, repeats=repeats, n_clusters=n_clusters,
        n_errors_baseline=pm.n_errors_baseline, n_errors_candidate=pm.n_errors_candidate,
        n_dropped_items=pm.n_dropped_items,
        mean_baseline=mean_a, mean_candidate=mean_b, delta=delta,
        se_baseline=se_a, se_candidate=se_b, se_unpaired=se_unp, se_paired=se_p,
        sd_diff=sd_diff, df=df if se_p is not None else None, rho=rho,
        ci_method=method, ci90=ci90, ci95=ci95,
        sigma_rule=rule,
        noninferiority=NonInferiority(margin=margin, alpha=alpha, ci=ci_dec, p=tests.p_ni, p_worse=tests.p_worse,
                                      method=method, verdict=ni_v),
        tost=TOST(margin=margin, alpha=alpha, p=tests.p_tost, method=method, verdict=tost_v),
        mcnemar=mcn, flips=flip, agreement=agreement, bootstrap=boot,
        mde=mde, n_needed=n_needed, repeats_needed=repeats_needed,
        information=information,
        multiplicity=Multiplicity(p_worse_holm=None, p_diff=tests.p_diff, q_bh=None),
        notes=notes,
    )


def _empty_estimate(pm: PairedMetric, cfg: StatsConfig, notes: list[str]) -> Estimate:
    return Estimate(
        task=pm.task, metric=pm.metric, filter=pm.filter, task_version=pm.task_version, binary=pm.binary,
        n=0, repeats=0, n_clusters=0, n_errors_baseline=pm.n_errors_baseline,
        n_errors_candidate=pm.n_errors_candidate, n_dropped_items=pm.n_dropped_items,
        mean_baseline=None, mean_candidate=None, delta=None, se_baseline=None, se_candidate=None,
        se_unpaired=None, se_paired=None, sd_diff=None, df=None, rho=None, ci_method="degenerate",
        ci90=None, ci95=None, sigma_rule=sigma_rule(0.0, None, None, cfg.k, cfg.basis),
        noninferiority=NonInferiority(margin=cfg.margin, alpha=cfg.alpha, ci=None, p=None, p_worse=None,
                                      method="degenerate", verdict="no_information"),
        tost=TOST(margin=cfg.margin, alpha=cfg.alpha, p=None, method="degenerate", verdict="no_information"),
        mcnemar=None, flips=None, agreement=None, bootstrap=None, mde=None, n_needed=None,
        repeats_needed=None, information=False, multiplicity=None, notes=notes,
    )


def excess_flips(cand_pair: PairedTask, rerun_pair: PairedTask, key: str) -> ExcessFlips | None:
    """Excess-flip test of the candidate over a baseline rerun for one "metric,filter"
    (docs/STATISTICS.md section 4). Both pairs share the baseline, so their keys line up."""
    assert [r.key for r in rerun_pair.baseline] == [r.key for r in cand_pair.baseline]
    rows = [
        (rb.scores.get(key), rc.scores.get(key), rr.scores.get(key))
        for rb, rc, rr in zip(cand_pair.baseline, cand_pair.candidate, rerun_pair.candidate, strict=True)
    ]
    kept = np.array([r for r in rows if None not in r], dtype=np.float64).reshape(-1, 3)  # (m, 3): base, cand, rerun
    if kept.shape[0] == 0:
        return None
    x = kept[:, 1] != kept[:, 0]
    y = kept[:, 2] != kept[:, 0]
    only_c, only_r = int(np.sum(x & ~y)), int(np.sum(~x & y))
    m = only_c + only_r
    p = float(stats.binomtest(only_c, m, 0.5, alternative="greater").pvalue) if m else 1.0
    n = int(kept.shape[0])
    aa = paired_metric(rerun_pair, key)
    aa_delta, aa_se, _ = cluster_mean_se(aa.cand - aa.base, aa.clusters if len(set(aa.clusters)) < len(aa.base) else None)
    return ExcessFlips(
        n=n, flips_candidate=int(x.sum()), flips_rerun=int(y.sum()), only_candidate=only_c, only_rerun=only_r,
        p_excess=p, rerun_rate=float(y.sum()) / n, rerun_ci95=wilson(int(y.sum()), n),
        aa_delta=aa_delta if len(aa.base) else None,
        aa_z=aa_delta / aa_se if aa_se else None,
    )


# --------------------------------------------------------------------------- across tasks


def adjust_multiplicity(estimates: Sequence[Estimate]) -> list[Estimate]:
    """Holm on p_worse (the "any task demonstrably worse" guard) and Benjamini-Hochberg on the
    two-sided p for delta = 0 (flags), across the estimates with information and those p-values
    (statsmodels multipletests). Returns new estimates; the inputs are not changed."""
    out = list(estimates)
    worse = [i for i, e in enumerate(out) if e.information and e.noninferiority.p_worse is not None]
    diff = [i for i, e in enumerate(out)
            if e.information and e.multiplicity is not None and e.multiplicity.p_diff is not None]
    holm = bh = np.array([])
    if worse:
        holm = multipletests([out[i].noninferiority.p_worse for i in worse], method="holm")[1]
    if diff:
        bh = multipletests([out[i].multiplicity.p_diff for i in diff], method="fdr_bh")[1]  # type: ignore[union-attr]
    holm_of = {i: float(p) for i, p in zip(worse, holm, strict=True)}
    bh_of = {i: float(q) for i, q in zip(diff, bh, strict=True)}
    for i, e in enumerate(out):
        p_diff = e.multiplicity.p_diff if e.multiplicity is not None else None
        mult = Multiplicity(p_worse_holm=holm_of.get(i), p_diff=p_diff, q_bh=bh_of.get(i))
        out[i] = e.model_copy(update={"multiplicity": mult})
    return out


def estimate_all(metrics: Sequence[PairedMetric], config: StatsConfig) -> list[Estimate]:
    """`estimate` for every paired metric, then the multiplicity adjustments across them."""
    return adjust_multiplicity([estimate(pm, config) for pm in metrics])
