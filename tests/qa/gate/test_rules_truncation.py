"""The truncation rule (qa.gate.rules.truncation) on real comparisons of records with truncations, and
the policy's choice of the gated answer filter per task."""

from __future__ import annotations

import pytest

from qa.errors import PolicyError
from qa.files.policy import default_policy, parse_policy
from qa.gate.rules import apply_rules, select_estimate
from qa.stats.intervals import delta_interval
from tests.qa.compare.generation_fixtures import FLEXIBLE, STRICT, flags, gen_comparison, gen_records

DEFAULT = default_policy()
N = 300  # items: enough that the accuracy rule (identical scores in both arms) passes on its own


def _verdict(base_items, cand_items, policy=DEFAULT, **kw):
    comp = gen_comparison(gen_records("baseline", flags(N, base_items), **kw),
                          gen_records("candidate", flags(N, cand_items), **kw))
    return comp, apply_rules(comp, policy)


def _rule(task_verdict):
    return next((r for r in task_verdict.rules if r.rule == "truncation"), None)


def test_candidate_truncating_beyond_the_margin_fails() -> None:
    comp, v = _verdict(range(3), range(60))  # +57 truncated items of 300: +19 pts
    t = v.tasks[0]
    rule = _rule(t)
    assert rule is not None and rule.decides and rule.status == "fail"
    assert (v.status, v.exit_code, t.status, t.kind) == ("fail", 1, "fail", "decided")
    assert t.reason.startswith("candidate truncates more: change in truncation rate +19.0 pts, 90% CI")
    assert "lies above +2.0 pts (truncated 3 -> 60 of 300 samples)" in t.reason
    est = comp.generation[0].truncation
    assert est is not None and rule.ci == delta_interval(est, 0.90) and rule.ci.lower > 0.02
    ni = next(r for r in t.rules if r.rule == "noninferiority")
    assert ni.status == "pass"  # accuracy alone would have passed


def test_same_truncations_in_both_arms_pass() -> None:
    _, v = _verdict(range(10), range(10))
    rule = _rule(v.tasks[0])
    assert rule is not None and rule.status == "pass" and rule.ci is not None and rule.ci.upper < 0.02
    assert v.status == "pass"


def test_neither_arm_truncating_is_a_pass_with_no_truncation() -> None:
    _, v = _verdict([], [])
    rule = _rule(v.tasks[0])
    assert rule is not None and rule.status == "pass" and rule.ci is None
    assert rule.detail.startswith("no truncation: neither arm reached max_tokens")
    assert v.status == "pass"


def test_a_rise_straddling_the_margin_is_inconclusive() -> None:
    _, v = _verdict(range(3), range(8))  # +5 of 300 = +1.7 pts, CI reaches past +2
    rule = _rule(v.tasks[0])
    assert rule is not None and rule.status == "inconclusive"
    assert rule.ci is not None and rule.ci.lower < 0.02 < rule.ci.upper
    assert (v.status, v.tasks[0].reason) == ("inconclusive", rule.detail)


def test_unrecorded_truncation_is_never_a_failure() -> None:
    comp = gen_comparison(gen_records("baseline", [[None]] * N), gen_records("candidate", [[None]] * N))
    v = apply_rules(comp, DEFAULT)
    assert _rule(v.tasks[0]) is None and v.status == "pass"


def test_truncation_fail_stands_when_accuracy_carries_no_information() -> None:
    _, v = _verdict(range(3), range(60), correct=[0.0] * N)  # both arms at the floor
    assert (v.tasks[0].status, v.tasks[0].kind) == ("fail", "decided")
    _, v = _verdict(range(3), range(3), correct=[0.0] * N)
    assert v.tasks[0].kind == "no_information"  # no truncation rise: the floor call-out as before


def test_reported_only_when_gate_truncation_is_off() -> None:
    policy = parse_policy("[default]\ngate_truncation = false")
    _, v = _verdict(range(3), range(60), policy=policy)
    rule = _rule(v.tasks[0])
    assert rule is not None and not rule.decides and rule.status == "fail"
    assert v.status == "pass"
    assert any(w.startswith("the truncation rule would fail this task") for w in v.tasks[0].warnings)


def test_margin_and_alpha_come_from_the_policy() -> None:
    comp, _ = _verdict(range(3), range(8))
    wide = apply_rules(comp, parse_policy("[default]\ntruncation_margin = 0.05\nalpha = 0.025"))
    rule = _rule(wide.tasks[0])
    est = comp.generation[0].truncation
    assert rule is not None and est is not None
    assert (rule.margin, rule.ci_level, rule.status) == (0.05, 0.95, "pass")
    assert rule.ci == est.ci95  # re-gated at alpha 0.025 by the estimate's own method (Tango here)


def test_default_policy_gates_the_model_card_filter() -> None:
    for task, key in (("gsm8k_cot_llama", STRICT), ("gsm8k_cot_zeroshot", FLEXIBLE), ("gsm8k", STRICT)):
        comp = gen_comparison(gen_records("baseline", flags(60, []), task=task),
                              gen_records("candidate", flags(60, []), task=task))
        est = select_estimate(comp, task, DEFAULT.for_task(task), explicit=task in DEFAULT.tasks)
        assert f"{est.metric},{est.filter}" == key
        assert apply_rules(comp, DEFAULT).tasks[0].metric == key


def test_a_policy_can_pick_the_other_filter() -> None:
    comp = gen_comparison(gen_records("baseline", flags(60, [])), gen_records("candidate", flags(60, [])))
    policy = parse_policy(f'[tasks.gsm8k_cot_llama]\nmetric = "{FLEXIBLE}"')
    assert apply_rules(comp, policy).tasks[0].metric == FLEXIBLE


@pytest.mark.parametrize(("text", "needle"), [
    ("[default]\ntruncation_margin = 0", "truncation_margin"),
    ("[default]\ngate_truncation = 1", "gate_truncation"),
    ("[default]\ntruncation_margn = 0.02", "did you mean 'truncation_margin'"),
])
def test_bad_truncation_keys_are_one_line_errors(text: str, needle: str) -> None:
    with pytest.raises(PolicyError, match=needle) as exc:
        parse_policy(text, "gate.toml")
    assert "\n" not in str(exc.value)
