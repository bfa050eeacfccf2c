"""qa.compare.generation: per-arm truncation rates with Wilson (effective-n) intervals, mean output
tokens, and the paired changes, checked against statsmodels / scipy and hand-computed values."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.proportion import proportion_confint

from qa.compare.generation import rate_interval
from qa.files.comparison import Comparison, load_comparison, save_comparison
from qa.stats.paired_tests import tango_interval
from tests.qa.compare.generation_fixtures import flags, gen_comparison, gen_records


def test_independent_samples_get_wilson() -> None:
    values = np.array([1.0] * 3 + [0.0] * 37)
    ci = rate_interval(values, np.arange(40).astype(str))
    lo, hi = proportion_confint(3, 40, alpha=0.05, method="wilson")
    assert (ci.lower, ci.upper) == pytest.approx((lo, hi), abs=1e-12)


def test_repeats_use_wilson_on_the_effective_sample_size() -> None:
    # 10 items x 2 repeats; item 0 truncated twice, item 1 once: k = 3, m = 20, p = 0.15.
    # CR1 residual sums per item: 2(0.85) = 1.7, 0.85 - 0.15 = 0.7, eight x 2(-0.15) = -0.3
    # SE^2 = 10/9 * (1.7^2 + 0.7^2 + 8 * 0.3^2) / 20^2; m_eff = 0.15 * 0.85 / SE^2 = 11.195...
    values = np.array([1, 1, 1, 0] + [0, 0] * 8, dtype=float)
    clusters = np.repeat(np.arange(10), 2).astype(str)
    se2 = 10 / 9 * (1.7**2 + 0.7**2 + 8 * 0.3**2) / 400
    m_eff = 0.15 * 0.85 / se2
    assert m_eff == pytest.approx(11.1951, abs=1e-4)
    lo, hi = proportion_confint(0.15 * m_eff, m_eff, alpha=0.05, method="wilson")
    ci = rate_interval(values, clusters)
    assert (ci.lower, ci.upper) == pytest.approx((lo, hi), abs=1e-12)
    independent = proportion_confint(3, 20, alpha=0.05, method="wilson")
    assert ci.upper - ci.lower > independent[1] - independent[0]  # correlated repeats: a wider interval


def test_no_truncation_with_repeats_counts_each_cluster_once() -> None:
    ci = rate_interval(np.zeros(24), np.repeat(np.arange(8), 3).astype(str))
    assert ci.lower == 0.0
    assert ci.upper == pytest.approx(proportion_confint(0, 8, alpha=0.05, method="wilson")[1], abs=1e-12)


def test_comparison_has_per_arm_rates_and_paired_change() -> None:
    # 40 items, one repeat: baseline truncates items 0-1, the candidate items 0-5 (4 more, 0 fewer).
    comp = gen_comparison(gen_records("baseline", flags(40, range(2))), gen_records("candidate", flags(40, range(6))))
    g = comp.generation_for("gsm8k_cot_llama")
    assert g is not None and g.n_unrecorded == 0
    assert (g.baseline.truncated, g.baseline.n_samples, g.candidate.truncated) == (2, 40, 6)
    assert g.candidate.truncation_rate == pytest.approx(0.15)
    lo, hi = proportion_confint(6, 40, alpha=0.05, method="wilson")
    assert (g.candidate.truncation_ci95.lower, g.candidate.truncation_ci95.upper) == pytest.approx((lo, hi))
    t = g.truncation
    assert t is not None and (t.metric, t.filter, t.n) == ("truncated", "none", 40)
    assert t.delta == pytest.approx(0.1)  # candidate - baseline: +10 points of truncation
    assert t.ci_method == "tango_score"  # binary, one repeat, 4 discordant items
    assert t.ci90 == tango_interval(4, 0, 40, 0.90)
    # output tokens: 256 when truncated, 64 otherwise -> mean 64 + 192 * rate
    assert g.baseline.mean_output_tokens == pytest.approx(64 + 192 * 2 / 40)
    assert g.candidate.mean_output_tokens == pytest.approx(64 + 192 * 6 / 40)
    assert g.output_tokens is not None and g.output_tokens.delta == pytest.approx(192 * 4 / 40)
    # accuracy estimates are untouched: the two filters, nothing named "truncated"
    assert sorted(f"{e.metric},{e.filter}" for e in comp.estimates) == [
        "exact_match,flexible-extract", "exact_match,strict-match"]


def test_output_length_change_has_the_paired_t_interval() -> None:
    rng = np.random.default_rng(3)
    base_tok = rng.integers(40, 200, size=30)
    cand_tok = base_tok + rng.integers(-5, 25, size=30)
    none = [[False]] * 30
    comp = gen_comparison(gen_records("baseline", none, tokens=[[int(x)] for x in base_tok]),
                          gen_records("candidate", none, tokens=[[int(x)] for x in cand_tok]))
    o = comp.generation[0].output_tokens
    d = (cand_tok - base_tok).astype(float)
    half = sps.t.ppf(0.975, 29) * d.std(ddof=1) / np.sqrt(30)
    assert o is not None and o.ci_method == "paired_t"
    assert o.delta == pytest.approx(d.mean())
    assert (o.ci95.lower, o.ci95.upper) == pytest.approx((d.mean() - half, d.mean() + half))


def test_repeats_are_averaged_per_item_and_clustered() -> None:
    comp = gen_comparison(gen_records("baseline", flags(30, [0], repeats=3)),
                          gen_records("candidate", flags(30, [0, 1, 2, 3], repeats=3)))
    g = comp.generation[0]
    assert (g.baseline.n_samples, g.candidate.truncated) == (90, 12)
    assert g.truncation is not None and g.truncation.repeats == 3
    assert g.truncation.delta == pytest.approx(3 / 30)
    assert g.truncation.ci_method == "paired_t"  # several repeats: no Tango
    assert g.candidate.truncation_ci95 == rate_interval(
        np.array([1.0] * 12 + [0.0] * 78), np.repeat(np.arange(30), 3).astype(str))


def test_unrecorded_truncation_is_left_out_not_a_truncation() -> None:
    base = flags(20, [0])
    cand: list[list[bool | None]] = [list(r) for r in flags(20, [0])]
    cand[5] = [None]  # this sample's truncation is not known
    comp = gen_comparison(gen_records("baseline", base), gen_records("candidate", cand))
    g = comp.generation[0]
    assert (g.n_unrecorded, g.baseline.n_samples, g.candidate.truncated) == (1, 19, 1)
    assert g.truncation is not None and g.truncation.n_errors_candidate == 1


def test_records_without_truncation_or_tokens_give_no_generation_estimate(tmp_path) -> None:
    none: list[list[bool | None]] = [[None]] * 10
    tokens: list[list[int | None]] = [[None]] * 10
    comp = gen_comparison(gen_records("baseline", none, tokens=tokens), gen_records("candidate", none, tokens=tokens))
    assert comp.generation == [] and comp.generation_for("gsm8k_cot_llama") is None
    # tokens recorded, truncation not: output length only
    only_tokens = gen_comparison(gen_records("baseline", none), gen_records("candidate", none))
    g = only_tokens.generation[0]
    assert g.truncation is None and g.baseline.truncation_rate is None and g.output_tokens is not None
    save_comparison(tmp_path / "comparison.json", only_tokens)
    assert load_comparison(tmp_path) == only_tokens


def test_schema_2_file_without_generation_still_loads(tmp_path) -> None:
    comp = Comparison(baseline="b", candidate="c")
    raw = comp.model_dump(mode="json")
    del raw["generation"]
    (tmp_path / "comparison.json").write_text(json.dumps(raw))
    assert load_comparison(tmp_path).generation == []
