"""The sequential look decision: simulated type-I error at the margin, A/A false fails and items used on a
large drop (seeded, binary paired data, the toolkit's own look_decision); how the gate honours a task
that stopped early; bad sequential policies as one-line errors with exit 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from qa.files.comparison import Estimate, SequentialLook, SequentialTask, save_comparison
from qa.files.policy import Policy, TaskPolicy
from qa.gate.rules import apply_rules
from qa.gate.sequential import look_decision, look_times, sequential_task
from qa.stats.intervals import delta_interval
from qa.stats.sequential import Design, boundaries_at, look_sizes, spent
from tests.qa.gate_fixtures import comparison, estimate_from_scores, scores
from tests.qa.stats_fixtures import est_of

FOUR = (0.25, 0.5, 0.75, 1.0)
MARGIN = 0.05
N = 400  # planned items; every look has >= 30 discordant items, so the toolkit's interval is paired t


def paired_t_estimate(a: np.ndarray, b: np.ndarray) -> Estimate:
    """The Estimate qa.compare.estimate builds for binary, unclustered, one-repeat data with >= 30 discordant
    items (paired t, n - 1 df), with only the fields the gate's look reads (fast enough for simulation)."""
    d = b - a
    n = len(d)
    sd = float(np.std(d, ddof=1))
    return Estimate(task="t", metric="acc", filter="none", binary=True, n=n, repeats=1, n_clusters=n,
                    n_errors_baseline=0, n_errors_candidate=0, n_dropped_items=0, mean_baseline=float(a.mean()),
                    mean_candidate=float(b.mean()), delta=float(d.mean()), sd_baseline=float(np.std(a, ddof=1)),
                    sd_candidate=float(np.std(b, ddof=1)), se_paired=sd / np.sqrt(n), sd_diff=sd, df=n - 1,
                    items_worse=int((d < 0).sum()), items_better=int((d > 0).sum()), ci_method="paired_t")


def draw(rng: np.random.Generator, p10: float, p01: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Binary paired scores (n,): P(base right, cand wrong) = p10, the reverse p01, else equal (delta = p01 - p10)."""
    u = rng.random(n)
    a = np.where(u < p10, 1.0, np.where(u < p10 + p01, 0.0, (rng.random(n) < 0.5).astype(float)))
    b = np.where(u < p10, 0.0, np.where(u < p10 + p01, 1.0, a))
    return a, b


def simulate(tp: TaskPolicy, p10: float, p01: float, reps: int, seed: int) -> tuple[dict[str, int], float]:
    """Run `reps` sequential trials: (counts of the decision each ended with, mean items used)."""
    rng = np.random.default_rng(seed)
    sizes = look_sizes(Design(tp.looks, tp.alpha, tp.spending), N)
    out = {"pass": 0, "fail": 0, "continue": 0}
    used = 0
    for _ in range(reps):
        a, b = draw(rng, p10, p01, N)
        for k, s in enumerate(sizes):
            lk = look_decision(paired_t_estimate(a[:s], b[:s]), tp, k, N)
            if lk.decision != "continue" or k == len(sizes) - 1:
                out[lk.decision] += 1
                used += s
                break
    return out, used / reps


def mc_limit(alpha: float, reps: int) -> float:
    """alpha plus the one-sided 99% Monte Carlo error of a rate estimated from `reps` trials."""
    return alpha + 2.33 * float(np.sqrt(alpha * (1 - alpha) / reps))


def test_the_fast_estimate_is_the_toolkits():
    a, b = draw(np.random.default_rng(5), 0.25, 0.20, 100)
    real, fast = est_of(a, b), paired_t_estimate(a, b)
    assert real.ci_method == "paired_t"
    for level in (0.9, 0.999):
        assert delta_interval(fast, level) == delta_interval(real, level)


@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock", "confidence_sequence"])
def test_size_at_the_margin_and_aa_false_fail(spending: str):
    tp = TaskPolicy(margin=MARGIN, looks=FOUR, spending=spending, min_n=50)
    fixed = TaskPolicy(margin=MARGIN, looks=(1.0,), min_n=50)
    reps = 600
    # true delta = -margin: a pass is a type-I error
    seq, _ = simulate(tp, 0.25, 0.20, reps, seed=1)
    fix, _ = simulate(fixed, 0.25, 0.20, reps, seed=1)  # the same draws at fixed n
    assert seq["pass"] / reps <= mc_limit(tp.alpha, reps)
    assert seq["pass"] <= fix["pass"] + 3  # the looks add no type-I error to the fixed-n test
    # A/A (delta = 0): a fail is a false alarm
    aa, _ = simulate(tp, 0.2, 0.2, reps // 2, seed=2)
    assert aa["fail"] / (reps // 2) <= tp.alpha


@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock", "confidence_sequence"])
def test_a_large_drop_stops_early(spending: str):
    tp = TaskPolicy(margin=MARGIN, looks=FOUR, spending=spending, min_n=50)
    out, items = simulate(tp, 0.50, 0.02, 50, seed=3)  # a destructive fault: delta = -48 pts
    assert out == {"pass": 0, "fail": 50, "continue": 0} and items == N / 4  # every one at the first look
    out, items = simulate(tp, 0.35, 0.10, 100, seed=3)  # delta = -25 pts
    assert out["fail"] == 100 and items <= N / 2


def test_a_clear_pass_saves_items():
    tp = TaskPolicy(margin=0.08, looks=FOUR, spending="obrien_fleming", min_n=50)
    out, items = simulate(tp, 0.15, 0.15, 100, seed=4)  # delta = 0, sd(d) 0.55: MDE at n = 400 is 6.8 pts
    assert out["fail"] == 0 and out["pass"] >= 90
    assert items <= 0.8 * N


def test_the_level_uses_the_actual_fraction():
    tp = TaskPolicy(looks=FOUR, alpha=0.05)
    a, b = scores(130, 60, 20, 15)
    lk = look_decision(estimate_from_scores("t", a, b), tp, 0, 400)  # an uneven first block: 130, not 100
    assert lk.fraction == pytest.approx(130 / 400)
    assert lk.z_crit == pytest.approx(stats.norm.isf(spent("obrien_fleming", 0.05, 130 / 400)), abs=1e-7)
    assert lk.adjusted_level == pytest.approx(1 - 2 * stats.norm.sf(lk.z_crit))
    ci = delta_interval(estimate_from_scores("t", a, b), lk.adjusted_level)
    assert (lk.lower, lk.upper) == (ci.lower, ci.upper)
    assert lk.alpha_spent == pytest.approx(spent("obrien_fleming", 0.05, 130 / 400))
    # a later look: the earlier looks at their planned sizes, the last one spends all of alpha
    assert look_times(tp, 2, 310, 400) == (0.25, 0.5, 310 / 400)
    assert look_times(tp, 3, 390, 400) == (0.25, 0.5, 0.75, 1.0)
    a, b = scores(390, 200, 20, 15)
    last = look_decision(estimate_from_scores("t", a, b), tp, 3, 400)
    assert last.z_crit == pytest.approx(boundaries_at(FOUR, 0.05, "obrien_fleming")[-1])


def test_pass_needs_min_n_and_information_fail_does_not():
    tp = TaskPolicy(looks=FOUR, margin=0.05, min_n=50)
    a, b = scores(40, 5, 30, 0)  # 30 of 40 regressions: fails at 40 items, under min_n
    assert look_decision(estimate_from_scores("t", a, b), tp, 0, 160).decision == "fail"
    floor = estimate_from_scores("t", [0.0] * 200, [0.0] * 200)  # both at the floor: no information
    assert look_decision(floor, tp.model_copy(update={"margin": 0.5}), 0, 800).decision == "continue"
    a, b = scores(200, 100, 1, 1)
    errs = estimate_from_scores("t", a, b, errors=(0, 20))  # 9% errored samples: never stops
    assert look_decision(errs, tp, 0, 800).decision == "continue"
    assert look_decision(estimate_from_scores("t", a, b), tp, 0, 800).decision == "pass"
    # a deciding sigma rule has no adjusted level: no early pass; TOST: better by far more than the margin fails
    sig = tp.model_copy(update={"rules": ("noninferiority", "sigma")})
    assert look_decision(estimate_from_scores("t", a, b), sig, 0, 800).decision == "continue"
    a, b = scores(200, 40, 0, 100)  # candidate better by 50 pts
    tost = tp.model_copy(update={"rules": ("noninferiority", "tost")})
    assert look_decision(estimate_from_scores("t", a, b), tost, 0, 800).decision == "fail"
    assert look_decision(estimate_from_scores("t", a, b), tp, 0, 800).decision == "pass"


def run_looks(a: np.ndarray, b: np.ndarray, tp: TaskPolicy) -> tuple[Estimate, list[SequentialLook]]:
    """Every look over a seeded shuffle of the items (the last estimate and the looks), never stopping."""
    order = np.random.default_rng(0).permutation(len(a))
    a, b = a[order], b[order]
    sizes = look_sizes(Design(tp.looks, tp.alpha, tp.spending), len(a))
    history = [look_decision(estimate_from_scores("t", a[:s], b[:s]), tp, k, len(a)) for k, s in enumerate(sizes)]
    return estimate_from_scores("t", a, b), history


def test_sequential_task_records_where_it_stopped():
    tp = TaskPolicy(looks=FOUR, margin=0.05)
    a, b = scores(200, 100, 1, 1)
    good = estimate_from_scores("t", a, b)
    seq = sequential_task(good, tp, [look_decision(good, tp, 0, 800)], 800)
    assert (seq.decision, seq.stopped_at, seq.items_used, seq.items_saved) == ("pass", 0, 200, 600)
    tp = tp.model_copy(update={"margin": 0.04})
    est, history = run_looks(*scores(800, 400, 60, 50), tp)  # lower limits -15.5, -8.6, -4.6, -3.5 pts
    seq = sequential_task(est, tp, history, 800)
    assert [lk.decision for lk in history] == ["continue"] * 3 + ["pass"]
    assert seq.decision == "final" and seq.stopped_at is None and seq.items_used == 800 and seq.items_saved == 0
    assert sequential_task(est, tp, history[:1], 800).decision == "continue"


def _gate(est: Estimate, seq: SequentialTask | None, tp: TaskPolicy):
    c = comparison(est).model_copy(update={"sequential": [seq] if seq else []})
    return apply_rules(c, Policy(default=tp)).tasks[0]


def test_the_gate_honours_an_early_stop():
    tp = TaskPolicy(looks=FOUR, margin=0.05, min_n=50)
    a, b = scores(200, 100, 1, 1)
    good = estimate_from_scores("t", a, b)
    seq = sequential_task(good, tp, [look_decision(good, tp, 0, 800)], 800)
    v = _gate(good, seq, tp)
    assert v.status == "pass" and v.kind == "decided"
    assert "sequential (obrien_fleming) look 1 of 4" in v.reason and "600 of 800 items not run" in v.reason
    assert v.alpha == pytest.approx(stats.norm.sf(seq.looks[0].z_crit))
    a, b = scores(100, 50, 40, 0)
    bad = estimate_from_scores("t", a, b)
    seq = sequential_task(bad, tp, [look_decision(bad, tp, 0, 400)], 400)
    v = _gate(bad, seq, tp)
    assert v.status == "fail" and "worse" in v.reason and "300 of 400 items not run" in v.reason
    # errors beyond the budget still make it inconclusive, whatever the looks said
    errs = good.model_copy(update={"n_errors_candidate": 30})
    assert _gate(errs, sequential_task(good, tp, [look_decision(good, tp, 0, 800)], 800), tp).kind == "errors"


def test_the_gate_decides_the_last_look_at_the_adjusted_level():
    tp = TaskPolicy(looks=FOUR, margin=0.04, min_n=50)
    est, history = run_looks(*scores(800, 400, 60, 50), tp)
    seq = sequential_task(est, tp, history, 800)
    v = _gate(est, seq, tp)
    z_last = boundaries_at(FOUR, 0.05, "obrien_fleming")[-1]
    assert v.alpha == pytest.approx(stats.norm.sf(z_last))  # 0.0427, not 0.05
    ni = next(r for r in v.rules if r.rule == "noninferiority")
    assert ni.ci_level == pytest.approx(1 - 2 * stats.norm.sf(z_last))
    assert v.status == "pass" and "(the last look" in v.reason
    # a run that ended between looks (killed, not resumed) has no decision
    v = _gate(est, sequential_task(est, tp, history[:2], 800), tp)
    assert v.status == "inconclusive" and "resume it" in v.reason


@pytest.mark.parametrize(("body", "needle"), [
    ("looks = [0.5, 0.25, 1.0]", "looks: must be strictly increasing in (0, 1] and end at 1.0"),
    ("looks = [0.5, 0.9]", "end at 1.0"),
    ("looks = [0.0, 1.0]", "strictly increasing in (0, 1]"),
    ("looks = [0.5, 1.5]", "strictly increasing in (0, 1]"),
    ('spending = "obrien"', "did you mean 'obrien_fleming'?"),
    ('spending = "linear"', "one of: obrien_fleming, pocock, confidence_sequence"),
    ("margin = 0", "margin: Input should be greater than 0"),
    ("margin = -0.02", "margin: Input should be greater than 0"),
])
def test_bad_sequential_policy_is_one_line_exit_2(tmp_path: Path, body: str, needle: str,
                                                  capsys: pytest.CaptureFixture[str]):
    from qa.cli import main

    a, b = scores(200, 100, 1, 1)
    save_comparison(tmp_path / "comparison.json", comparison(estimate_from_scores("t", a, b)))
    bad = tmp_path / "bad.toml"
    bad.write_text(f"version = 1\n[default]\n{body}\n", encoding="utf-8")
    with pytest.raises(SystemExit) as info:
        main(["gate", str(tmp_path), "--policy", str(bad)])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2
    assert err.startswith("error: ") and needle in err and "\n" not in err and "Traceback" not in err
