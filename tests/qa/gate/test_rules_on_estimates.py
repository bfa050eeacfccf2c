"""The gate's decisions on estimates computed by qa.stats from paired records."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from qa.files.policy import default_policy, parse_policy
from qa.gate.rules import decide_task, no_information
from tests.qa.stats_fixtures import continuous, est_of

TP = default_policy().for_task("t")
TOST = parse_policy('[default]\nrules = ["tost"]').for_task("t")


def test_clear_drop_fails_and_clear_parity_passes() -> None:
    assert decide_task(est_of(*continuous(2000, seed=2, shift=-0.08, noise=0.05)), TP, "acc,none").status == "fail"
    e = est_of(*continuous(2000, seed=2, shift=0.0, noise=0.05))
    ni, eq = decide_task(e, TP, "acc,none"), decide_task(e, TOST, "acc,none")
    assert (ni.status, eq.status) == ("pass", "pass")
    assert ni.mde < TP.margin


def test_improvement_beyond_margin_fails_tost_not_noninferiority() -> None:
    e = est_of(*continuous(2000, seed=4, shift=0.08, noise=0.05))
    ni = decide_task(e, TP, "acc,none")
    assert ni.status == "pass" and any("candidate better by" in w for w in ni.warnings)
    assert decide_task(e, TOST, "acc,none").status == "fail"


def test_underpowered_when_mde_exceeds_margin() -> None:
    e = est_of(*continuous(60, seed=6, shift=0.0, noise=0.3))
    t = decide_task(e, TP, "acc,none")
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.8)
    assert t.mde == pytest.approx(z * e.se_paired) and t.mde > TP.margin
    assert (t.status, t.kind) == ("inconclusive", "underpowered")
    assert t.n_needed == math.ceil((z * e.sd_diff / TP.margin) ** 2)


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_floor_or_ceiling_in_both_arms_is_no_information(value: float) -> None:
    # SmolLM2-135M on 5-shot GSM8K: 0/30 in both arms, every difference and SE is 0.
    e = est_of([value] * 30, [value] * 30)
    t = decide_task(e, parse_policy('[default]\nrules = ["sigma"]').for_task("t"), "acc,none")
    assert (t.status, t.kind) == ("inconclusive", "no_information")
    assert ("floor" if value == 0 else "ceiling") in t.reason
    assert e.se_paired == 0.0


def test_baseline_at_floor_is_no_information() -> None:
    b = [0.0] * 40
    b[3] = 1.0
    assert "baseline scores 0" in no_information(est_of([0.0] * 40, b))


def test_sigma_rule_baseline_basis_false_alarm_follows_rho() -> None:
    e = est_of(*continuous(500, seed=8, noise=0.05))
    sig = decide_task(e, TP, "acc,none").rules[-1]
    assert sig.rule == "sigma" and sig.basis == "baseline"
    assert sig.false_alarm_rate == pytest.approx(2 * stats.norm.sf(1.5 * e.se_baseline / e.se_paired))


def test_per_task_margin_comes_from_the_policy() -> None:
    e = est_of(*continuous(200, seed=9), task="gpqa")
    policy = parse_policy("[tasks.gpqa]\nmargin = 0.05")
    assert decide_task(e, policy.for_task("gpqa"), "acc,none").margin == 0.05
    assert decide_task(e, policy.for_task("other"), "acc,none").margin == 0.02
