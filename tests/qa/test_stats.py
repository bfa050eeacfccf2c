"""qa.stats: hand-computed cases and scipy/statsmodels cross-checks; degenerate data never passes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import optimize, stats
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint
from statsmodels.stats.weightstats import ttost_paired

from evals.records import SampleRecord
from qa.comparison import Estimate, StatsConfig, TaskOverride
from qa.pairing import pair_records, paired_metric
from qa.stats import (
    adjust_multiplicity,
    bootstrap_delta,
    cluster_mean_se,
    estimate,
    mcnemar,
    needed_items,
    needed_repeats,
    sigma_rule,
    tango_constrained_p21,
    tango_interval,
    tango_statistic,
    wilson,
)

CFG = StatsConfig(bootstrap_n=200, seed=0)


def recs(arm: str, scores: dict[tuple[str, int], float | None], *, task: str = "t",
         clusters: dict[str, str] | None = None, key: str = "acc,none") -> list[SampleRecord]:
    return [
        SampleRecord(task=task, task_version="1", arm=arm, item_id=i, repeat=r, prompt_hash=f"p{i}",
                     cluster=(clusters or {}).get(i), scores={key: v})
        for (i, r), v in scores.items()
    ]


def est_of(a, b, *, config: StatsConfig = CFG, repeats: int = 1, clusters=None, task: str = "t") -> Estimate:
    """Estimate for per-(item, repeat) score arrays a, b of shape (n,) or (n, repeats)."""
    a, b = np.asarray(a, float).reshape(len(a), -1), np.asarray(b, float).reshape(len(b), -1)
    cl = {f"{i:04d}": clusters[i] for i in range(len(a))} if clusters is not None else None
    sa = {(f"{i:04d}", r): float(a[i, r]) for i in range(len(a)) for r in range(a.shape[1])}
    sb = {(f"{i:04d}", r): float(b[i, r]) for i in range(len(b)) for r in range(b.shape[1])}
    pt = pair_records(recs("base", sa, task=task, clusters=cl), recs("cand", sb, task=task, clusters=cl))[0]
    return estimate(paired_metric(pt, "acc,none"), config)


def continuous(n: int, seed: int, shift: float = 0.0, noise: float = 0.1):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 1, n)
    b = np.clip(a + shift + rng.normal(0, noise, n), 0, 1)
    return a, b


# --------------------------------------------------------------------------- building blocks


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


def test_mcnemar_hand_computed_and_statsmodels() -> None:
    m = mcnemar(7, 1)  # X ~ Bin(8, 1/2): P(X <= 1) = 9/256
    assert m.p_exact == pytest.approx(18 / 256)
    assert m.p_midp == pytest.approx(18 / 256 - 8 / 256)
    assert m.p_exact == pytest.approx(sm_mcnemar([[5, 7], [1, 9]], exact=True).pvalue)
    m = mcnemar(2, 1)  # exact 1 (capped), mid-p 1 - P(X = 2) = 1 - 3/8
    assert (m.p_exact, m.p_midp) == pytest.approx((1.0, 0.625))
    assert (mcnemar(4, 4).p_exact, mcnemar(4, 4).p_midp) == (1.0, 1.0)
    assert mcnemar(0, 0).p_exact == 1.0


# --------------------------------------------------------------------------- Tango


def test_tango_published_example() -> None:
    # Bentur et al. (2009) paired 2x2 [[1, 1], [7, 12]], the worked example of Fagerland, Lydersen &
    # Laake (2014) and of contingencytables::Tango_asymptotic_score_CI_paired_2x2: -0.517 to -0.026.
    iv = tango_interval(n01=1, n10=7, n=21, conf=0.95)
    assert (iv.lower, iv.upper) == pytest.approx((-0.517, -0.026), abs=6e-4)


@pytest.mark.parametrize(("n12", "n21", "n", "d0"), [(3, 9, 50, -0.05), (0, 4, 30, 0.02), (5, 1, 40, 0.1)])
def test_tango_constrained_mle_matches_numeric_optimum(n12: int, n21: int, n: int, d0: float) -> None:
    # Multinomial likelihood with p12 = p21 + d0: maximise over p21 (p11 + p22 = 1 - 2 p21 - d0).
    n_conc = n - n12 - n21

    def nll(p21: float) -> float:
        p12 = p21 + d0
        rest = 1 - p12 - p21
        return -(n12 * math.log(max(p12, 1e-300)) + n21 * math.log(max(p21, 1e-300))
                 + n_conc * math.log(max(rest, 1e-300)))

    lo, hi = max(0.0, -d0) + 1e-12, (1 - d0) / 2 - 1e-12
    ref = optimize.minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12}).x
    assert tango_constrained_p21(n12, n21, n, d0) == pytest.approx(ref, abs=1e-6)


def test_tango_statistic_at_zero_is_mcnemar_z() -> None:
    assert tango_statistic(3, 11, 100, 0.0) == pytest.approx((3 - 11) / math.sqrt(14))


def test_tango_interval_endpoints_and_zero_discordant_closed_form() -> None:
    z = stats.norm.ppf(0.95)
    iv = tango_interval(n01=2, n10=9, n=120, conf=0.90)
    assert tango_statistic(2, 9, 120, iv.lower) == pytest.approx(z, abs=1e-7)
    assert tango_statistic(2, 9, 120, iv.upper) == pytest.approx(-z, abs=1e-7)
    # No discordant pairs: T(d) = -sqrt(n d / (1 - d)) for d > 0, so the limit is z^2 / (n + z^2).
    iv0 = tango_interval(0, 0, 100, 0.90)
    assert iv0.upper == pytest.approx(z**2 / (100 + z**2), abs=1e-8)
    assert iv0.lower == pytest.approx(-iv0.upper, abs=1e-8)
    assert tango_interval(0, 10, 10, 0.95).lower == -1.0


# --------------------------------------------------------------------------- estimates vs scipy


def test_paired_t_matches_scipy_and_statsmodels() -> None:
    a, b = continuous(80, seed=1, shift=-0.01)
    e = est_of(a, b)
    d = b - a
    assert e.ci_method == "paired_t"
    assert e.delta == pytest.approx(d.mean())
    assert e.se_paired == pytest.approx(stats.sem(d))
    assert e.se_baseline == pytest.approx(stats.sem(a))
    assert e.se_unpaired == pytest.approx(math.hypot(stats.sem(a), stats.sem(b)))
    assert e.rho == pytest.approx(np.corrcoef(a, b)[0, 1])
    tt = stats.ttest_rel(b, a)
    for ci, level in ((e.ci90, 0.90), (e.ci95, 0.95)):
        ref = tt.confidence_interval(level)
        assert (ci.lower, ci.upper) == pytest.approx((ref.low, ref.high))
    m = CFG.margin
    ni = stats.ttest_1samp(d, -m, alternative="greater").pvalue
    assert e.noninferiority.p == pytest.approx(ni)
    assert e.noninferiority.p_worse == pytest.approx(1 - ni)
    assert e.tost.p == pytest.approx(ttost_paired(b, a, -m, m)[0])
    assert e.multiplicity.p_diff == pytest.approx(tt.pvalue)


def test_sign_convention_candidate_minus_baseline() -> None:
    e = est_of([1.0, 0.8, 0.6, 0.9], [0.5, 0.4, 0.3, 0.5])
    assert e.delta == pytest.approx(-0.4)
    assert e.mean_candidate - e.mean_baseline == pytest.approx(e.delta)


def test_clustered_uses_cr1_with_g_minus_1_df() -> None:
    rng = np.random.default_rng(5)
    n = 60
    clusters = [f"c{i // 6}" for i in range(n)]  # 10 clusters of 6
    a = rng.uniform(0, 1, n)
    b = np.clip(a + np.repeat(rng.normal(0, 0.05, 10), 6) + rng.normal(0, 0.02, n), 0, 1)
    e = est_of(a, b, clusters=clusters)
    d = b - a
    g = np.repeat(np.arange(10), 6)
    fit = sm.OLS(d, np.ones((n, 1))).fit(cov_type="cluster", cov_kwds={"groups": g})
    assert e.ci_method == "cluster_cr1_t"
    assert e.n_clusters == 10 and e.df == 9
    assert e.se_paired == pytest.approx(fit.bse[0])
    half = stats.t.ppf(0.95, 9) * fit.bse[0]
    assert (e.ci90.lower, e.ci90.upper) == pytest.approx((d.mean() - half, d.mean() + half))
    assert e.bootstrap is not None and e.bootstrap.unit == "cluster"


def test_binary_few_discordant_uses_tango() -> None:
    a = np.array([1] * 60 + [0] * 40)
    b = a.copy()
    b[:5] = 0  # 5 regressions
    b[60:61] = 1  # 1 improvement
    e = est_of(a, b)
    assert e.binary and e.ci_method == "tango_score"
    iv = tango_interval(n01=1, n10=5, n=100, conf=0.90)
    assert (e.ci90.lower, e.ci90.upper) == pytest.approx((iv.lower, iv.upper))
    assert e.mcnemar.n10 == 5 and e.mcnemar.n01 == 1
    assert e.flips.n10 == 5 and e.flips.n01 == 1 and e.flips.rate == pytest.approx(0.06)
    lo, hi = proportion_confint(6, 100, method="wilson")
    assert (e.flips.ci95.lower, e.flips.ci95.upper) == pytest.approx((lo, hi))
    assert e.noninferiority.p == pytest.approx(stats.norm.sf(tango_statistic(1, 5, 100, -0.02)))


# --------------------------------------------------------------------------- decisions


def test_clear_drop_fails_and_clear_parity_passes() -> None:
    a, b = continuous(2000, seed=2, shift=-0.08, noise=0.05)
    assert est_of(a, b).noninferiority.verdict == "fail"
    a, b = continuous(2000, seed=2, shift=0.0, noise=0.05)
    e = est_of(a, b)
    assert e.noninferiority.verdict == "pass" and e.tost.verdict == "pass"
    assert e.mde < CFG.margin


def test_improvement_beyond_margin_fails_tost_not_noninferiority() -> None:
    a, b = continuous(2000, seed=4, shift=0.08, noise=0.05)
    e = est_of(a, b)
    assert e.noninferiority.verdict == "pass"
    assert e.tost.verdict == "fail"
    assert any("better by more than the margin" in n for n in e.notes)


def test_underpowered_when_mde_exceeds_margin() -> None:
    a, b = continuous(30, seed=6, shift=0.0, noise=0.3)
    e = est_of(a, b)
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.8)
    assert e.mde == pytest.approx(z * e.se_paired)
    assert e.mde > CFG.margin
    assert e.noninferiority.verdict == "underpowered"
    assert e.n_needed == math.ceil((z * e.sd_diff / CFG.margin) ** 2)


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_floor_or_ceiling_in_both_arms_is_no_information(value: float) -> None:
    # SmolLM2-135M on 5-shot GSM8K: 0/30 in both arms, every difference and SE is 0.
    e = est_of([value] * 30, [value] * 30)
    assert not e.information
    assert e.noninferiority.verdict == "no_information"
    assert e.tost.verdict == "no_information"
    assert e.sigma_rule.passed is None
    assert e.se_paired == 0.0
    assert any("no information" in n for n in e.notes)


def test_baseline_at_floor_is_no_information() -> None:
    b = [0.0] * 40
    b[3] = 1.0
    e = est_of([0.0] * 40, b)
    assert e.noninferiority.verdict == "no_information"


def test_all_zero_differences_with_varied_scores_use_binomial_bound() -> None:
    a = np.linspace(0.05, 0.95, 400)  # non-binary scores, candidate identical on every item
    e = est_of(a, a.copy())
    h = 1 - 0.05 ** (1 / 400)
    assert e.ci_method == "degenerate" and e.information
    assert (e.ci90.lower, e.ci90.upper) == pytest.approx((-h, h))
    assert e.noninferiority.verdict == "pass"  # 0.0075 < 0.02, and said so in the notes
    assert any("every paired difference is 0" in n for n in e.notes)


def test_sigma_rule_hand_computed() -> None:
    r = sigma_rule(-0.03, 0.02, 0.01, 1.5, "baseline")
    assert r.threshold == pytest.approx(0.03) and r.passed
    assert r.ratio == pytest.approx(1.5)
    assert r.false_alarm_rate == pytest.approx(2 * stats.norm.sf(3.0))
    assert r.drop_caught_80 == pytest.approx(0.03 + stats.norm.ppf(0.8) * 0.01)
    # paired basis: 13.4% per task at any n
    assert sigma_rule(0.0, 0.01, 0.01, 1.5, "paired").false_alarm_rate == pytest.approx(0.1336, abs=1e-4)
    assert not sigma_rule(0.031, 0.02, 0.01, 1.5, "baseline").passed


def test_sigma_rule_baseline_basis_false_alarm_follows_rho() -> None:
    a, b = continuous(500, seed=8, noise=0.05)
    e = est_of(a, b)
    ratio = e.se_baseline / e.se_paired
    assert e.sigma_rule.false_alarm_rate == pytest.approx(2 * stats.norm.sf(1.5 * ratio))
    assert e.sigma_rule.basis == "baseline"


def test_per_task_override_changes_margin() -> None:
    a, b = continuous(200, seed=9)
    cfg = StatsConfig(bootstrap_n=0, overrides={"gpqa": TaskOverride(margin=0.05)})
    assert est_of(a, b, config=cfg, task="gpqa").noninferiority.margin == 0.05
    assert est_of(a, b, config=cfg, task="other").noninferiority.margin == 0.02


# --------------------------------------------------------------------------- repeats, power, bootstrap


def test_repeats_are_averaged_before_differencing() -> None:
    a = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 1]])
    b = np.array([[1, 1, 1], [0, 0, 1], [1, 0, 1], [0, 0, 1]])
    e = est_of(a, b)
    d = b.mean(axis=1) - a.mean(axis=1)
    assert e.repeats == 3 and e.n == 4
    assert e.delta == pytest.approx(d.mean())
    assert e.se_paired == pytest.approx(stats.sem(d))
    assert e.mcnemar.unit == "item_repeat"
    assert e.ci_method == "paired_t"  # Tango is for single-repeat data only


def test_needed_items_and_repeats_hand_computed() -> None:
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.8)  # 2.4865
    assert needed_items(0.3, 0.02, 0.05, 0.8) == math.ceil((z * 0.3 / 0.02) ** 2)
    # sd_item 0.3 at K = 1 with within sd 0.25: tau^2 = 0.09 - 0.0625; n = 2000, margin 0.02
    k = needed_repeats(0.3, 0.25, 1, 2000, 0.02, 0.05, 0.8)
    room = 2000 * 0.02**2 / z**2 - (0.09 - 0.0625)
    assert k == math.ceil(0.0625 / room)
    assert needed_repeats(0.3, 0.1, 1, 100, 0.02, 0.05, 0.8) is None  # between-item variance alone too big


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


# --------------------------------------------------------------------------- multiplicity


def test_holm_and_bh_match_multipletests_and_hand_values() -> None:
    ests = [est_of(*continuous(100, seed=s, shift=sh)) for s, sh in ((1, -0.03), (2, 0.0), (3, -0.01))]
    adj = adjust_multiplicity(ests)
    p_worse = [e.noninferiority.p_worse for e in ests]
    p_diff = [e.multiplicity.p_diff for e in ests]
    assert [e.multiplicity.p_worse_holm for e in adj] == pytest.approx(list(multipletests(p_worse, method="holm")[1]))
    assert [e.multiplicity.q_bh for e in adj] == pytest.approx(list(multipletests(p_diff, method="fdr_bh")[1]))
    # hand values for Holm / BH on (0.01, 0.04, 0.03)
    assert list(multipletests([0.01, 0.04, 0.03], method="holm")[1]) == pytest.approx([0.03, 0.06, 0.06])
    assert list(multipletests([0.01, 0.04, 0.03], method="fdr_bh")[1]) == pytest.approx([0.03, 0.04, 0.04])


def test_no_information_tasks_stay_out_of_the_multiplicity_family() -> None:
    informative = est_of(*continuous(100, seed=1))
    dead = est_of([0.0] * 30, [0.0] * 30)
    adj = adjust_multiplicity([informative, dead])
    assert adj[1].multiplicity.p_worse_holm is None and adj[1].multiplicity.q_bh is None
    assert adj[0].multiplicity.p_worse_holm == pytest.approx(informative.noninferiority.p_worse)


def test_bca_matches_scipy_on_the_same_bootstrap_distribution() -> None:
    from types import SimpleNamespace

    from qa.stats import bca_interval

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


def test_excess_flips_against_baseline_rerun_hand_computed() -> None:
    from qa.stats import excess_flips

    base = [1, 1, 1, 1, 0, 0, 0, 1, 1, 0]
    cand = [0, 0, 1, 0, 1, 0, 0, 1, 1, 0]  # differs from base on items 0, 1, 3, 4
    rer = [1, 0, 1, 1, 0, 1, 0, 1, 1, 0]  # differs from base on items 1, 5
    mk = lambda arm, xs: recs(arm, {(str(i), 0): float(v) for i, v in enumerate(xs)})
    (pc,) = pair_records(mk("b", base), mk("c", cand))
    (pr,) = pair_records(mk("b", base), mk("r", rer))
    ef = excess_flips(pc, pr, "acc,none")
    assert (ef.n, ef.flips_candidate, ef.flips_rerun, ef.only_candidate, ef.only_rerun) == (10, 4, 2, 3, 1)
    assert ef.p_excess == pytest.approx(5 / 16)  # P(Bin(4, 1/2) >= 3)
    assert ef.rerun_rate == pytest.approx(0.2)
    assert ef.aa_delta == pytest.approx(0.0)
