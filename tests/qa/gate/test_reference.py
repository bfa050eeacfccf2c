"""The reference-answer rules: their intervals (hand-computed t limits), when they decide (a task with no
information by default, "always", "instead_of_accuracy", "never"), "not available", older comparisons gated as before, the
policy keys and their one-line errors."""

from __future__ import annotations

import pytest
from scipy import stats as sps

from qa.errors import PolicyError
from qa.files.comparison import Comparison, Interval, ReferenceEstimate, ReferenceStat
from qa.files.policy import TaskPolicy, default_policy, parse_policy
from qa.gate.reference import kl_rule, logprob_rule, stat_interval
from qa.gate.rules import apply_rules
from tests.qa.gate_fixtures import estimate_from_scores

FLOOR = [0.0] * 20  # GSM8K for SmolLM2-135M: both arms at 0% -> no information
MIXED_B = [1.0, 0.0] * 15
MIXED_C = [1.0, 0.0] * 15


def stat(value: float, se: float, df: int = 19) -> ReferenceStat:
    h = float(sps.t.ppf(0.975, df)) * se
    return ReferenceStat(value=value, se=se, df=df, ci95=Interval(lower=value - h, upper=value + h))


def ref(task: str, delta: float, kl: float, se: float = 0.002, n: int = 20) -> ReferenceEstimate:
    return ReferenceEstimate(task=task, n=n, n_clusters=n, n_tokens=50 * n, n_missing=0, mean_logprob_baseline=-0.9,
                             mean_logprob_candidate=-0.9 + delta, delta_logprob=stat(delta, se, n - 1),
                             kld=stat(kl, se, n - 1), kld_p99=3 * kl, kld_max=5 * kl)


def comparison(*refs: ReferenceEstimate, base: list[float] = FLOOR, cand: list[float] = FLOOR) -> Comparison:
    est = estimate_from_scores("gsm8k", base, cand, metric="exact_match", filter="strict-match")
    return Comparison(baseline="b", candidate="c", estimates=[est], reference=list(refs))


def policy(**keys: object):  # -> Policy
    body = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in keys.items())
    return parse_policy(f"version = 1\n[default]\n{body}\n")


def test_interval_is_the_t_interval_at_the_gates_level() -> None:
    s = stat(-0.01, 0.004, 15)
    ci = stat_interval(s, 0.90)
    h = float(sps.t.ppf(0.95, 15)) * 0.004
    assert ci is not None and ci.lower == pytest.approx(-0.01 - h) and ci.upper == pytest.approx(-0.01 + h)
    assert stat_interval(ReferenceStat(value=0.1, se=None, df=None, ci95=None), 0.9) is None


@pytest.mark.parametrize(("delta", "kl", "want_lp", "want_kl"), [
    (-0.001, 0.001, "pass", "pass"),  # far inside both margins
    (-0.20, 0.30, "fail", "fail"),  # a destructive fault
    (-0.05, 0.05, "inconclusive", "inconclusive"),  # CIs across the margins
])
def test_rules_against_their_margins(delta: float, kl: float, want_lp: str, want_kl: str) -> None:
    tp = TaskPolicy(reference_logprob_margin=0.05, reference_kl_margin=0.05)
    r = ref("gsm8k", delta, kl, se=0.01)
    assert logprob_rule(r, tp, True).status == want_lp
    assert kl_rule(r, tp, True).status == want_kl


def test_by_default_the_reference_decides_a_task_without_information() -> None:
    good, bad = comparison(ref("gsm8k", -0.001, 0.001)), comparison(ref("gsm8k", -0.5, 0.6))
    v_good, v_bad = apply_rules(good, default_policy()), apply_rules(bad, default_policy())
    [t] = v_good.tasks
    assert t.status == "pass" and t.kind == "decided" and "decided on the reference answers (20 items)" in t.reason
    assert t.reason.startswith("no information") and t.p_worse is None
    assert {r.rule: r.decides for r in t.rules if r.rule.startswith("reference")} == {"reference_logprob": True,
                                                                                       "reference_kl": True}
    assert v_bad.status == "fail" and v_bad.tasks[0].kind == "decided"
    unclear = apply_rules(comparison(ref("gsm8k", -0.001, 0.001, se=0.2)), default_policy()).tasks[0]
    assert unclear.status == "inconclusive" and unclear.kind == "no_information"


def test_where_accuracy_decides_the_rules_are_reported_unless_always() -> None:
    comp = comparison(ref("gsm8k", -0.5, 0.6), base=MIXED_B * 14, cand=MIXED_C * 14)  # 420 identical: accuracy passes
    reported = apply_rules(comp, default_policy()).tasks[0]
    assert reported.status == "pass" and all(not r.decides for r in reported.rules if r.rule.startswith("reference"))
    assert any(r.rule == "reference_kl" and r.status == "fail" for r in reported.rules)
    always = apply_rules(comp, policy(reference_gate="always")).tasks[0]
    assert always.status == "fail" and always.reason.startswith("reference answers (20 items): reference less likely")
    never = apply_rules(comparison(ref("gsm8k", -0.5, 0.6)), policy(reference_gate="never")).tasks[0]
    assert never.status == "inconclusive" and never.kind == "no_information"


def test_instead_of_accuracy_the_reference_decides_and_only_an_accuracy_fail_stands() -> None:
    # 30 items, 15 flips each way: accuracy straddles the 2-point margin (inconclusive, underpowered)
    undecided_b, undecided_c = [1.0, 0.0] * 15, [0.0, 1.0] * 15
    instead = policy(reference_gate="instead_of_accuracy")
    good = apply_rules(comparison(ref("gsm8k", -0.001, 0.001), base=undecided_b, cand=undecided_c), instead).tasks[0]
    assert good.status == "pass" and good.kind == "decided" and good.p_worse is None
    assert good.reason.startswith("decided on the reference answers (20 items)") and "accuracy (reported)" in good.reason
    assert {r.rule: r.decides for r in good.rules} == {"noninferiority": True, "sigma": False,
                                                        "reference_logprob": True, "reference_kl": True}
    bad = apply_rules(comparison(ref("gsm8k", -0.5, 0.6), base=undecided_b, cand=undecided_c), instead).tasks[0]
    assert bad.status == "fail" and "reference less likely" in bad.reason
    unclear = apply_rules(comparison(ref("gsm8k", -0.001, 0.001, se=0.2), base=undecided_b, cand=undecided_c),
                          instead).tasks[0]
    assert unclear.status == "inconclusive"
    # accuracy demonstrably worse (every item 1 -> 0): that fail stands whatever the reference answers say
    worse = apply_rules(comparison(ref("gsm8k", -0.001, 0.001), base=[1.0] * 30, cand=[0.0] * 30), instead).tasks[0]
    assert worse.status == "fail" and worse.kind == "decided"
    # without the reference signal the accuracy verdict stands (not available)
    na = ReferenceEstimate(task="gsm8k", n=0, n_clusters=0, n_tokens=0, n_missing=30, unavailable="no log-probs")
    alone = apply_rules(comparison(na, base=undecided_b, cand=undecided_c), instead).tasks[0]
    assert alone.status == "inconclusive" and any("not available" in w for w in alone.warnings)


def test_not_available_and_older_comparisons() -> None:
    na = ReferenceEstimate(task="gsm8k", n=0, n_clusters=0, n_tokens=0, n_missing=20,
                           unavailable="not available: the server does not echo prompt log-probs")
    [t] = apply_rules(comparison(na), default_policy()).tasks
    assert t.status == "inconclusive" and t.kind == "no_information"
    assert any("reference-answer signal not available" in w for w in t.warnings)
    old = apply_rules(comparison(), default_policy())  # written before the reference signal existed
    assert old.tasks[0].kind == "no_information" and not any(r.rule.startswith("reference") for r in old.tasks[0].rules)


def test_policy_keys_and_their_errors() -> None:
    tp = default_policy().default
    assert tp.reference_gate == "when_no_information"
    assert 0 < tp.reference_logprob_margin and 0 < tp.reference_kl_margin
    with pytest.raises(PolicyError, match="reference_gate"):
        policy(reference_gate="sometimes")
    with pytest.raises(PolicyError, match="reference_kl_margin"):
        policy(reference_kl_margin=0.0)
    with pytest.raises(PolicyError, match="did you mean 'reference_logprob_margin'"):
        parse_policy("version = 1\n[default]\nreference_logprob_margn = 0.1\n")
