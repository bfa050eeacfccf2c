"""The gate's decisions (qa.gate.rules) on hand-built and real estimates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from evals.records.samples import SampleRecord
from qa.compare.arms import Arm, compare_arms
from qa.errors import PolicyError
from qa.files.comparison import Interval, StatsSettings
from qa.files.policy import default_policy, parse_policy
from qa.gate.rules import apply_rules, no_information, sigma
from qa.stats.intervals import delta_interval
from qa.stats.paired_tests import tango_interval
from tests.qa.gate_fixtures import comparison, estimate_from_scores, scores

DEFAULT = default_policy()


def _one(task: str, n: int, both: int, n10: int, n01: int, **kw: object):
    a, b = scores(n, both, n10, n01)
    return estimate_from_scores(task, a, b, **kw)


def test_pass_with_hand_computed_ci() -> None:
    # d: 20 x -1, 18 x +1, 962 x 0 -> mean -0.002, var (38 - 1000 * 0.002^2) / 999
    est = _one("arc", 1000, 600, 20, 18)
    se = math.sqrt((38 - 1000 * 0.002**2) / 999 / 1000)
    half = sps.t.ppf(0.95, 999) * se
    v = apply_rules(comparison(est), DEFAULT)
    t = v.tasks[0]
    ni = t.rules[0]
    assert (v.status, t.status, t.kind, v.exit_code) == ("pass", "pass", "decided", 0)
    assert ni.rule == "noninferiority" and ni.decides
    assert ni.ci is not None
    assert ni.ci.lower == pytest.approx(-0.002 - half, abs=1e-12)
    assert ni.ci.upper == pytest.approx(-0.002 + half, abs=1e-12)
    assert ni.ci.lower == pytest.approx(-0.012154, abs=1e-6)
    assert t.mde == pytest.approx((sps.norm.ppf(0.95) + sps.norm.ppf(0.8)) * se)
    # the 1.5-SE rule is reported, not deciding
    sig = t.rules[-1]
    assert sig.rule == "sigma" and not sig.decides


def test_fail_when_ci_below_minus_margin() -> None:
    v = apply_rules(comparison(_one("mmlu", 1000, 600, 60, 15)), DEFAULT)
    assert (v.status, v.exit_code, v.tasks[0].kind) == ("fail", 1, "decided")
    assert "lies below -2.0 pts" in v.tasks[0].reason


def test_straddling_ci_is_inconclusive() -> None:
    # delta = -0.02 exactly at the margin, MDE 1.9 pts < 2 pts: enough power, no decision
    v = apply_rules(comparison(_one("t", 1000, 500, 40, 20)), DEFAULT)
    t = v.tasks[0]
    assert t.mde is not None and t.mde < 0.02
    assert (v.status, v.exit_code, t.kind) == ("inconclusive", 3, "decided")
    assert "straddles" in t.reason


def test_underpowered_is_inconclusive_or_fail_by_policy() -> None:
    est = _one("gpqa_diamond", 198, 60, 14, 9)
    t = apply_rules(comparison(est), DEFAULT).tasks[0]
    assert (t.status, t.kind) == ("inconclusive", "underpowered")
    assert t.n_needed is not None and t.n_needed > 198
    assert f"need about {t.n_needed} items" in t.reason
    strict = parse_policy('[default]\nunderpowered = "fail"')
    assert apply_rules(comparison(est), strict).tasks[0].status == "fail"


def test_underpowered_pass_is_not_a_pass() -> None:
    # Identical arms except 1 regression and 1 improvement on 40 items: n < min_n (50).
    t = apply_rules(comparison(_one("small", 40, 20, 1, 1)), DEFAULT).tasks[0]
    assert (t.status, t.kind) == ("inconclusive", "underpowered")
    assert "n = 40 < min_n 50" in t.reason


def test_demonstrably_worse_fails_even_when_underpowered() -> None:
    t = apply_rules(comparison(_one("small", 40, 10, 20, 0)), DEFAULT).tasks[0]
    assert (t.status, t.kind) == ("fail", "decided")


@pytest.mark.parametrize("value", [0.0, 1.0])
@pytest.mark.parametrize("rules", ['["noninferiority"]', '["sigma"]', '["tost", "sigma"]'])
def test_floor_or_ceiling_is_no_information_never_pass(value: float, rules: str) -> None:
    est = estimate_from_scores(
        "gsm8k", [value] * 300, [value] * 300, metric="exact_match", filter="strict-match"
    )
    assert no_information(est) is not None
    v = apply_rules(comparison(est), parse_policy(f"[default]\nrules = {rules}"))
    assert (v.status, v.tasks[0].kind, v.exit_code) == ("inconclusive", "no_information", 3)
    assert "no information" in v.tasks[0].reason
    assert ("floor" if value == 0 else "ceiling") in v.tasks[0].reason


def test_identical_arms_at_mid_accuracy_pass() -> None:
    # Every item agrees (SE 0) but accuracy is 60%: that is information (no flips), and it passes.
    est = _one("same", 500, 300, 0, 0)
    assert no_information(est) is None
    assert apply_rules(comparison(est), DEFAULT).status == "pass"


def test_error_rate_above_budget_is_inconclusive() -> None:
    est = _one("arc", 1000, 600, 20, 18, errors=(12, 0))
    t = apply_rules(comparison(est), DEFAULT).tasks[0]
    assert t.error_rate_baseline == pytest.approx(12 / 1012)
    assert (t.status, t.kind) == ("inconclusive", "errors")
    assert "baseline 1.2% > max 1.0%" in t.reason
    lenient = parse_policy("[default]\nmax_error_rate = 0.05")
    assert apply_rules(comparison(est), lenient).status == "pass"


def test_sigma_rule_false_alarm_rate_hand_computed() -> None:
    est = _one("arc", 1000, 600, 20, 18).model_copy(
        update={"se_baseline": 0.02, "se_paired": 0.01, "se_unpaired": 0.03, "delta": -0.029}
    )
    r = sigma(est, 1.5, "baseline", decides=True)
    assert r.threshold == pytest.approx(0.03)
    assert r.status == "pass"  # |-0.029| <= 0.03
    assert r.false_alarm_rate == pytest.approx(2 * (1 - sps.norm.cdf(3.0)))  # 0.0027
    assert r.drop_caught_80 == pytest.approx(0.03 + sps.norm.ppf(0.8) * 0.01)
    paired = sigma(est, 1.5, "paired", decides=True)
    assert paired.false_alarm_rate == pytest.approx(0.13361, abs=1e-5)  # 13.4% at any n
    assert paired.status == "fail"  # 0.029 > 0.015
    assert sigma(est, 1.5, "unpaired", decides=False).threshold == pytest.approx(0.045)


def test_sigma_only_policy_decides_by_sigma() -> None:
    est = _one("mmlu", 1000, 600, 60, 15)
    v = apply_rules(comparison(est), parse_policy('[default]\nrules = ["sigma"]'))
    assert v.status == "fail"
    assert v.tasks[0].rules[0].rule == "noninferiority" and not v.tasks[0].rules[0].decides


def test_tost_fails_large_improvement_noninferiority_warns() -> None:
    est = _one("arc", 1000, 500, 5, 60)  # candidate +5.5 pts
    ni = apply_rules(comparison(est), DEFAULT).tasks[0]
    assert ni.status == "pass"
    assert any("candidate better by" in w for w in ni.warnings)
    tost = apply_rules(comparison(est), parse_policy('[default]\nrules = ["tost"]')).tasks[0]
    assert tost.status == "fail"
    assert "not equivalent" in tost.reason


def test_regating_with_other_alpha_recomputes_ci() -> None:
    est = _one("arc", 1000, 600, 20, 18)
    assert delta_interval(est, 0.95) == est.ci95
    ci80 = delta_interval(est, 0.80)
    half = sps.t.ppf(0.90, 999) * est.se_paired
    assert est.ci_method == "paired_t"
    assert ci80 == Interval(lower=est.delta - half, upper=est.delta + half)
    v = apply_rules(comparison(est), parse_policy("[default]\nalpha = 0.10"))
    assert v.tasks[0].rules[0].ci_level == pytest.approx(0.80)


def _records(arm: str, task: str, a: np.ndarray, key: str = "acc,none") -> list[SampleRecord]:
    return [
        SampleRecord(
            task=task,
            task_version="1",
            arm=arm,
            item_id=f"i{i}",
            prompt_hash=f"{i:064d}",
            scores={key: float(s)},
            choice_loglikelihoods=[-1.0, -2.0],
        )
        for i, s in enumerate(a)
    ]


def _real(task: str, a: np.ndarray, b: np.ndarray):
    base = Arm(label="baseline", format="records", records=tuple(_records("baseline", task, a)))
    cand = Arm(label="candidate", format="records", records=tuple(_records("candidate", task, b)))
    return compare_arms(base, cand, StatsSettings(bootstrap_n=0))


def test_regating_tango_estimate_uses_tango_at_new_level() -> None:
    a, b = scores(300, 150, 4, 2)  # 6 discordant pairs: qa.stats uses the Tango score interval
    comp = _real("boolq", a, b)
    est = comp.estimates[0]
    assert est.ci_method == "tango_score"
    assert delta_interval(est, 0.90) == est.ci90
    assert delta_interval(est, 0.80) == tango_interval(2, 4, 300, 0.80)


def test_real_stats_floor_and_pass() -> None:
    comp = _real("gsm8k_like", np.zeros(200), np.zeros(200))
    assert apply_rules(comp, DEFAULT).tasks[0].kind == "no_information"
    a, b = scores(400, 240, 3, 3)
    assert apply_rules(_real("arc", a, b), DEFAULT).status == "pass"


def test_overall_status_is_intersection_union() -> None:
    ok, bad, unsure = _one("a", 1000, 600, 20, 18), _one("b", 1000, 600, 60, 15), _one("c", 198, 60, 14, 9)
    assert apply_rules(comparison(ok, bad, unsure), DEFAULT).status == "fail"
    v = apply_rules(comparison(ok, unsure), DEFAULT)
    assert v.status == "inconclusive"
    assert v.summary == "INCONCLUSIVE: 1 inconclusive (c); 1 of 2 passed"
    assert apply_rules(comparison(ok), DEFAULT).summary == "PASS: all 1 task(s) pass"
    empty = apply_rules(comparison(), DEFAULT)
    assert (empty.status, empty.exit_code) == ("inconclusive", 3)


def test_required_missing_task_is_inconclusive() -> None:
    v = apply_rules(comparison(_one("a", 1000, 600, 20, 18)), parse_policy('require = ["gsm8k"]'))
    assert v.status == "inconclusive"
    assert v.tasks[-1].task == "gsm8k" and v.tasks[-1].kind == "missing"


def test_metric_selection() -> None:
    strict = _one("gsm8k", 500, 100, 5, 5, metric="exact_match", filter="strict-match")
    flex = _one("gsm8k", 500, 100, 30, 5, metric="exact_match", filter="flexible-extract")
    v = apply_rules(comparison(flex, strict), DEFAULT)
    assert v.tasks[0].metric == "exact_match,strict-match"  # AUTO_METRICS order
    chosen = parse_policy('[tasks.gsm8k]\nmetric = "exact_match,flexible-extract"')
    assert apply_rules(comparison(flex, strict), chosen).tasks[0].metric == "exact_match,flexible-extract"
    with pytest.raises(PolicyError, match=r"\[tasks.gsm8k\] metric 'acc,none' not in the comparison"):
        apply_rules(comparison(flex, strict), parse_policy('[tasks.gsm8k]\nmetric = "acc,none"'))
    odd = [_one("x", 100, 50, 1, 1, metric=m) for m in ("f1", "bleu")]
    with pytest.raises(PolicyError, match="several metrics"):
        apply_rules(comparison(*odd), DEFAULT)


