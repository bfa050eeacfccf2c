"""Regression tests for the statistics defects found in review, with the numbers of each."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats as sps

from evals.records.samples import SampleRecord
from qa.compare.arms import Arm, compare_arms
from qa.files.comparison import Comparison, Estimate, StatsSettings
from qa.files.policy import default_policy, parse_policy
from qa.gate.rules import apply_rules, decide_task
from qa.plan.sample_size import sample_size_plan
from qa.stats.intervals import delta_interval
from qa.stats.power import items_needed
from tests.qa.gate_fixtures import comparison, scores

DEFAULT = default_policy()


def _records(arm: str, values: np.ndarray, repeats: int = 1) -> tuple[SampleRecord, ...]:
    v = np.asarray(values, dtype=float).reshape(len(values), -1)
    return tuple(SampleRecord(task="t", task_version="1", arm=arm, item_id=f"i{i}", repeat=r,
                              prompt_hash=f"{i:064d}", scores={"acc,none": float(v[i, r])})
                 for i in range(len(v)) for r in range(v.shape[1]))


def _compare(a: np.ndarray, b: np.ndarray) -> Comparison:
    return compare_arms(Arm("baseline", "records", _records("baseline", a)),
                        Arm("candidate", "records", _records("candidate", b)), StatsSettings(bootstrap_n=0))


def test_zero_discordant_pairs_at_alpha_004_is_inconclusive_with_tango_bounds() -> None:
    a, b = scores(100, 60, 0, 0)  # 100 identical binary items
    comp = _compare(a, b)
    est = comp.estimates[0]
    assert est.ci_method == "tango_score"
    t = apply_rules(comp, parse_policy("[default]\nalpha = 0.04")).tasks[0]
    assert t.status == "inconclusive"
    ci = t.rules[0].ci
    assert t.rules[0].ci_level == pytest.approx(0.92)
    assert 100 * ci.upper == pytest.approx(2.97, abs=0.01) and ci.lower == pytest.approx(-ci.upper)
    z = sps.norm.ppf(0.96)
    assert ci.upper == pytest.approx(z**2 / (100 + z**2))  # Tango with no discordant pairs, closed form


def test_true_drop_at_the_margin_passes_at_most_alpha() -> None:
    # n = 50, alpha 0.01, true drop 2 pts = the margin: each item regresses with probability 0.02. The old
    # gate passed whenever no item regressed (a point CI at 0): 0.98^50 = 36%. Exactly, over every count:
    policy = parse_policy("[default]\nalpha = 0.01")
    p_pass = 0.0
    for k in range(8):  # P(k > 7) < 1e-6
        a, b = scores(50, 30, k, 0)
        if apply_rules(_compare(a, b), policy).status == "pass":
            p_pass += sps.binom.pmf(k, 50, 0.02)
    assert p_pass <= 0.01


@pytest.mark.parametrize("shift", [0.01, 0.25])
def test_constant_nonzero_difference_gets_an_honest_bound(shift: float) -> None:
    a = np.linspace(0.25, 0.75, 100) if shift == 0.01 else np.repeat([0.25, 0.5, 0.75, 1.0], 25)
    b = a - shift  # 0.01: float noise gave SE 2.8e-19 and a point CI [-1.0, -1.0] pts that passed
    est = _compare(a, b).estimates[0]
    assert est.ci_method == "degenerate"
    p = 1 - 0.05 ** (1 / 100)
    ci = delta_interval(est, 0.90)
    assert (ci.lower, ci.upper) == pytest.approx((-shift - p * (1 - shift), -shift + p * (1 + shift)))
    t = apply_rules(comparison(est), DEFAULT).tasks[0]
    assert t.status != "pass"


def test_non_finite_numbers_are_refused_when_a_comparison_is_built() -> None:
    est = _compare(*scores(60, 30, 3, 2)).estimates[0]
    with pytest.raises(ValidationError):
        Estimate(**{**est.model_dump(), "delta": float("nan")})
    with pytest.raises(ValidationError):
        Estimate(**{**est.model_dump(), "se_paired": float("inf")})


def test_mcnemar_with_repeats_is_on_items_and_keeps_its_size() -> None:
    # K = 8 repeats of a null candidate: (item, repeat) pairs treated as independent rejected 19.6% at 5%.
    rng = np.random.default_rng(0)
    rejections, sims = 0, 200
    for _ in range(sims):
        p = rng.uniform(0, 1, 60)
        a = rng.random((60, 8)) < p[:, None]
        b = rng.random((60, 8)) < p[:, None]
        comp = compare_arms(Arm("b", "records", _records("b", a, 8)), Arm("c", "records", _records("c", b, 8)),
                            StatsSettings(bootstrap_n=0))
        m = comp.estimates[0].mcnemar
        assert m is not None and m.unit == "item" and m.method == "sign_test_items"
        rejections += m.p_exact < 0.05
    assert rejections / sims <= 0.07  # exact test: at most 5% plus Monte Carlo error (sd 1.5%)


def test_items_needed_for_zero_sd_is_one_formula() -> None:
    expected = 149  # n > ln(0.05) / ln(0.98) = 148.3
    assert items_needed(0.0, 0.02, 0.05, 0.8) == expected
    a, b = scores(100, 60, 0, 0)
    assert apply_rules(_compare(a, b), DEFAULT).tasks[0].n_needed == expected
    assert sample_size_plan("arc_easy", 0.02, accuracy=0.0).rows[0].items_needed == expected  # sd exactly 0


def test_floor_reasons_say_what_they_saw() -> None:
    one = apply_rules(_compare(np.array([1.0]), np.array([1.0])), DEFAULT).tasks[0]
    assert one.kind == "no_information" and "only 1 paired item" in one.reason and "both arms" not in one.reason
    a = np.zeros(40)
    b = np.zeros(40)
    b[:2] = 1.0  # 0% -> 5%
    up = apply_rules(_compare(a, b), DEFAULT).tasks[0]
    assert up.kind == "no_information" and "baseline scores 0" in up.reason and "both arms" not in up.reason


def test_comparison_json_holds_numbers_only(tmp_path: Path) -> None:
    comp = _compare(*scores(200, 100, 6, 4))
    data = json.loads(comp.model_dump_json())
    banned = {"sigma_rule", "noninferiority", "tost", "verdict", "mde", "n_needed", "repeats_needed",
              "information", "margin", "alpha", "passed"}

    def keys(obj: object) -> set[str]:
        if isinstance(obj, dict):
            return set(obj) | {k for v in obj.values() for k in keys(v)}
        if isinstance(obj, list):
            return {k for v in obj for k in keys(v)}
        return set()

    assert not keys(data) & banned


def test_regating_shows_only_the_new_policys_warnings() -> None:
    a, b = scores(2000, 1000, 10, 80)  # candidate +3.5 pts
    est = _compare(a, b).estimates[0]
    tp2 = DEFAULT.for_task("t")
    tp5 = parse_policy("[default]\nmargin = 0.05").for_task("t")
    assert any("better by" in w for w in decide_task(est, tp2, "acc,none").warnings)
    assert not any("better by" in w or "margin" in w for w in decide_task(est, tp5, "acc,none").warnings)
