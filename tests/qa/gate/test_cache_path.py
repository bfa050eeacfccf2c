"""The cache-path rules (qa.gate.cache_path) through qa.gate.rules.apply_rules on comparisons of hand-made
sessions records: by default (cache_gate = "warm_path") the candidate's warm path is gated against the
baseline's cold path and the drift is reported beside it; with cache_gate = "drift" a hit rate of 0 is
no information (never a pass) and excess flips and excess KL fail; gate_cache_path = false only reports;
a saved comparison.json re-gates to the same verdict."""

from __future__ import annotations

import math

import pytest

from evals.records.samples import write_records
from qa.compare.arms import compare_arms, load_arm
from qa.files.comparison import Comparison, StatsSettings, load_comparison, save_comparison
from qa.files.policy import default_policy, parse_policy
from qa.gate.rules import apply_rules
from tests.qa.cache_path_fixtures import ref, sessions_arm

# A loose policy under which the identical cold paths of 12 turns pass on their own, so that what the
# cache-path rules add is visible: the exact bound on 0 of 12 differing items is about +-22 pts.
LOOSE = parse_policy("version = 1\n[default]\nmargin = 0.5\nmin_n = 2\n", "loose.toml")
DRIFT = parse_policy('version = 1\n[default]\nmargin = 0.5\nmin_n = 2\ncache_gate = "drift"\n', "drift.toml")
FLIPPED = frozenset({(s, 1) for s in range(6)})  # six units whose warm answer flips (three each way)
DOWN = frozenset({(0, 1), (1, 2), (2, 1), (3, 2)})  # four right cold answers that the warm path gets wrong


def _comparison(base, cand, tmp_path) -> Comparison:  # type: ignore[no-untyped-def]
    for arm, recs in (("baseline", base), ("candidate", cand)):
        write_records(tmp_path / arm / "sessions.jsonl", recs)
    return compare_arms(load_arm(tmp_path / "baseline"), load_arm(tmp_path / "candidate"), StatsSettings(bootstrap_n=0))


def _rules(tv) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {r.rule: r for r in tv.rules}


def test_warm_equal_to_cold_with_hits_passes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    v = apply_rules(_comparison(sessions_arm("baseline"), sessions_arm("candidate"), tmp_path), LOOSE)
    (t,) = v.tasks
    rules = _rules(t)
    assert {k: r.status for k, r in rules.items() if k.startswith("cache_")} == {
        "cache_hit_rate": "pass", "cache_flips": "pass", "cache_kl": "pass", "cache_accuracy": "pass",
        "cache_reference_logprob": "pass", "cache_reference_kl": "pass"}
    # accuracy carries information, so the reference rules on the warm path are reported, not deciding
    assert not rules["cache_reference_logprob"].decides and rules["cache_accuracy"].decides
    assert (v.status, t.kind) == ("pass", "decided")
    assert rules["cache_hit_rate"].detail.startswith("warm-path hit rate: candidate 30.0% (360 of 1200 prompt tokens)")


@pytest.mark.parametrize("cached", [0, None])
def test_no_measured_hit_is_no_information_never_a_pass(tmp_path, cached) -> None:  # type: ignore[no-untyped-def]
    v = apply_rules(_comparison(sessions_arm("baseline"), sessions_arm("candidate", cached=cached), tmp_path), DRIFT)
    (t,) = v.tasks
    assert (v.status, t.status, t.kind) == ("inconclusive", "inconclusive", "no_information")
    assert t.reason.startswith("cache path: no information: the candidate")
    assert _rules(t)["noninferiority"].status == "pass"  # the cold path alone would have passed


def test_excess_warm_path_flips_fail(tmp_path) -> None:  # type: ignore[no-untyped-def]
    comp = _comparison(sessions_arm("baseline"), sessions_arm("candidate", flipped=FLIPPED), tmp_path)
    v = apply_rules(comp, DRIFT)
    (t,) = v.tasks
    flips = _rules(t)["cache_flips"]
    assert flips.status == "fail" and "6 only in the candidate, 0 only in the baseline" in flips.detail
    assert comp.cache_path[0].excess_flips["exact_match,none"].p_excess == pytest.approx(0.5**6)
    assert (v.status, t.status) == ("fail", "fail") and t.reason.startswith("cache path: the warm path flips more")
    assert comp.estimates[0].delta == 0.0  # the cold paths agree: only the cache path shows it


def test_kl_non_inferiority_against_the_margin(tmp_path) -> None:  # type: ignore[no-untyped-def]
    comp = _comparison(sessions_arm("baseline"), sessions_arm("candidate", warm_p=0.5), tmp_path)
    kl = comp.cache_path[0].kld
    assert kl is not None and kl.se == 0.0 and kl.delta > 0.1  # KL(0.8 || 0.5) = 0.193 nats on every turn
    t = apply_rules(comp, DRIFT).tasks[0]
    assert _rules(t)["cache_kl"].status == "fail" and t.status == "fail"
    strict_n = parse_policy("version = 1\n[default]\nmargin = 0.5\nmin_n = 50\n", "n.toml")
    assert _rules(apply_rules(comp, strict_n).tasks[0])["cache_kl"].status == "inconclusive"  # 12 turns < min_n
    wide = parse_policy("version = 1\n[default]\nmargin = 0.5\nmin_n = 2\ncache_kl_margin = 0.5\n", "w.toml")
    assert _rules(apply_rules(comp, wide).tasks[0])["cache_kl"].status == "pass"


def test_kl_interval_straddling_the_margin_is_inconclusive(tmp_path) -> None:  # type: ignore[no-untyped-def]
    far = ref(0.3)  # KL(0.8 || 0.3) = 0.53 nats on one turn of 12: mean 0.045, CR1 SE 0.045
    cand = [r.model_copy(update={"reference_logprobs": far}) if r.item_id == "s000/t2/warm" else r
            for r in sessions_arm("candidate")]
    comp = _comparison(sessions_arm("baseline"), cand, tmp_path)
    kl = comp.cache_path[0].kld
    assert kl is not None and kl.se and kl.se > 0
    rule = _rules(apply_rules(comp, LOOSE).tasks[0])["cache_kl"]
    assert rule.ci is not None and rule.ci.lower < 0.01 < rule.ci.upper and rule.status == "inconclusive"


def test_accuracy_of_the_warm_path_uses_the_task_rules(tmp_path) -> None:  # type: ignore[no-untyped-def]
    comp = _comparison(sessions_arm("baseline"), sessions_arm("candidate", flipped=DOWN), tmp_path)
    (acc_est,) = comp.cache_path[0].accuracy
    assert acc_est.delta == pytest.approx(-4 / 12) and acc_est.ci_method == "cluster_cr1_t"
    t = apply_rules(comp, default_policy()).tasks[0]
    acc = _rules(t)["cache_accuracy"]
    assert acc.detail.startswith("candidate warm path vs baseline cold path (90% CI")
    assert acc.status == "fail" and acc.ci is not None and acc.ci.upper < -0.02  # decisive at n = 12
    assert _rules(t)["cache_flips"].status == "pass"  # 4 one-way flips: p = 1/16, not below alpha
    assert (t.status, t.kind) == ("fail", "decided") and "worse" in t.reason


@pytest.mark.parametrize("cand", [{"flipped": FLIPPED}, {"warm_p": 0.5}], ids=["excess-flips", "excess-kl"])
def test_by_default_the_warm_path_is_gated_and_the_drift_reported(tmp_path, cand) -> None:  # type: ignore[no-untyped-def]
    """Flips both ways (warm accuracy unchanged on average) or a warm path further from cold: the drift rules
    fail but only report; the task is what the warm path's accuracy against the baseline's cold path says
    (6 flips of 12 leave its interval wider than the margin: inconclusive; the KL case: pass)."""
    comp = _comparison(sessions_arm("baseline"), sessions_arm("candidate", **cand), tmp_path)
    (t,) = apply_rules(comp, LOOSE).tasks
    rules = _rules(t)
    drift = "cache_flips" if "flipped" in cand else "cache_kl"
    assert rules[drift].status == "fail" and not rules[drift].decides
    assert rules["cache_accuracy"].decides and not rules["cache_hit_rate"].decides
    assert t.status == rules["cache_accuracy"].status == ("inconclusive" if "flipped" in cand else "pass")
    assert any(w.startswith(f"the {drift} rule would fail this task") and "cache_gate = warm_path" in w
               for w in t.warnings)
    assert (apply_rules(comp, DRIFT).tasks[0].status) == "fail"  # a release that changes only the cache path


def test_a_warm_path_that_never_hit_is_said_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    comp = _comparison(sessions_arm("baseline"), sessions_arm("candidate", cached=0), tmp_path)
    (t,) = apply_rules(comp, LOOSE).tasks
    assert t.status == "pass" and any("never hit its prefix cache: it was a cold path" in w for w in t.warnings)


def test_gate_cache_path_false_only_reports(tmp_path) -> None:  # type: ignore[no-untyped-def]
    comp = _comparison(sessions_arm("baseline"), sessions_arm("candidate", flipped=FLIPPED), tmp_path)
    off = parse_policy("version = 1\n[default]\nmargin = 0.5\nmin_n = 2\ngate_cache_path = false\n", "off.toml")
    (t,) = apply_rules(comp, off).tasks
    assert t.status == "pass"
    assert all(not r.decides for r in t.rules if r.rule.startswith("cache_"))
    assert any(w.startswith("the cache_flips rule would fail this task") for w in t.warnings)


def test_saved_comparison_regates_to_the_same_verdict(tmp_path) -> None:  # type: ignore[no-untyped-def]
    comp = _comparison(sessions_arm("baseline"), sessions_arm("candidate", flipped=FLIPPED), tmp_path)
    save_comparison(tmp_path / "comparison.json", comp)
    again = load_comparison(tmp_path / "comparison.json")
    assert again == comp
    assert apply_rules(again, DRIFT) == apply_rules(comp, DRIFT)


def test_a_bad_policy_value_is_one_line() -> None:
    with pytest.raises(Exception, match=r"cache_kl_margin: Input should be greater than 0"):
        parse_policy("version = 1\n[default]\ncache_kl_margin = -0.1\n", "bad.toml")
    with pytest.raises(Exception, match="did you mean 'cache_kl_margin'"):
        parse_policy("version = 1\n[default]\ncache_kl_margn = 0.1\n", "bad.toml")
    with pytest.raises(Exception, match="cache_gate") as info:
        parse_policy('version = 1\n[default]\ncache_gate = "drfit"\n', "bad.toml")
    assert "\n" not in str(info.value)


def _at_the_floor(records):  # type: ignore[no-untyped-def]
    """The records with every score 0: accuracy carries no information in either arm or path."""
    return [r.model_copy(update={"scores": {k: 0.0 for k in r.scores}}) for r in records]


def test_where_warm_accuracy_has_no_information_the_warm_reference_answers_decide(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Both arms at the floor: the warm path's reference answers (p 0.8 -> 0.5 on every turn: delta log-prob
    log(0.5 / 0.8) = -0.47 nats/token, beyond the default 0.25 margin) fail the task, as they would the cold path."""
    comp = _comparison(_at_the_floor(sessions_arm("baseline")), _at_the_floor(sessions_arm("candidate", warm_p=0.5)),
                       tmp_path)
    ref_est = comp.cache_path[0].warm_reference
    assert ref_est is not None and ref_est.n == 12 and ref_est.delta_logprob is not None
    assert ref_est.delta_logprob.value == pytest.approx(math.log(0.5 / 0.8))
    t = apply_rules(comp, default_policy()).tasks[0]
    rules = _rules(t)
    assert rules["cache_accuracy"].status == "inconclusive" and not rules["cache_accuracy"].decides
    assert rules["cache_reference_logprob"].decides and rules["cache_reference_logprob"].status == "fail"
    assert rules["cache_reference_logprob"].detail.startswith("candidate warm path vs baseline cold path")
    assert t.status == "fail" and t.reason.startswith("cache path: candidate warm path vs baseline cold path")


def test_warm_reference_answers_as_close_as_the_cold_ones_pass_at_the_floor(tmp_path) -> None:  # type: ignore[no-untyped-def]
    comp = _comparison(_at_the_floor(sessions_arm("baseline")), _at_the_floor(sessions_arm("candidate")), tmp_path)
    t = apply_rules(comp, default_policy()).tasks[0]
    rules = _rules(t)
    assert (rules["cache_reference_logprob"].decides, rules["cache_reference_logprob"].status) == (True, "pass")
    assert (rules["cache_reference_kl"].decides, rules["cache_reference_kl"].status) == (True, "pass")
    assert t.status == "pass" and "decided on the reference answers (12 items)" in t.reason
