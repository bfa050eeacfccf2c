"""`qa compare` and `qa plan` end to end: lm-eval sample files and record folders in, comparison.json
out, numbers checked against scipy on the same synthetic paired data; user errors are one line, exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from evals.engines.base import TokenLogprobs
from evals.records.samples import SampleRecord, write_records
from qa.cli import main
from qa.files.comparison import load_comparison
from qa.stats.paired_tests import tango_interval
from tests.evals.lmeval_fixtures import gen_lines, mc_lines, write_run


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def paired_binary(n: int, seed: int, p: float = 0.6, flip: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = (rng.random(n) < p).astype(int)
    b = a.copy()
    f = rng.random(n) < flip
    b[f] = (rng.random(f.sum()) < p - 0.03).astype(int)  # resampled answers, slightly worse
    return a, b


@pytest.fixture
def lmeval_arms(tmp_path: Path) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    a, b = paired_binary(400, seed=11)
    comps = [f"The answer is {i}" for i in range(30)]
    comps_c = list(comps)
    comps_c[4] = "The answer is four"
    answers = [str(i) for i in range(30)]
    answers_c = list(answers)
    answers_c[4] = "four"
    write_run(tmp_path / "base", {"arc_easy": mc_lines(a), "gsm8k": gen_lines([0] * 30, [0] * 30, comps, answers)})
    write_run(tmp_path / "cand", {"arc_easy": mc_lines(b, seed_shift=1),
                                  "gsm8k": gen_lines([0] * 30, [0] * 30, comps_c, answers_c)})
    return tmp_path / "base", tmp_path / "cand", a, b


def test_compare_lmeval_folders_matches_scipy(lmeval_arms, tmp_path: Path, capsys) -> None:
    base, cand, a, b = lmeval_arms
    out = tmp_path / "out"
    rc, stdout, _ = run_cli(["compare", str(base), str(cand), "--out", str(out), "--bootstrap", "200"], capsys)
    assert rc == 0
    assert "comparison.json" in stdout
    raw = json.loads((out / "comparison.json").read_text())
    assert "candidate - baseline" in raw["sign_convention"]
    comp = load_comparison(out)
    assert (comp.baseline, comp.candidate) == ("base", "cand")
    acc = comp.estimate("arc_easy", "acc", "none")
    d = (b - a).astype(float)
    n10, n01 = int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1)))
    assert acc.n == 400 and acc.delta == pytest.approx(d.mean())
    assert acc.se_paired == pytest.approx(stats.sem(d))
    assert acc.se_baseline == pytest.approx(stats.sem(a))
    assert (acc.mcnemar.n10, acc.mcnemar.n01) == (n10, n01)
    assert acc.mcnemar.p_exact == pytest.approx(stats.binomtest(n10, n10 + n01, 0.5).pvalue)
    if n10 + n01 >= 30:
        ci = stats.ttest_rel(b, a).confidence_interval(0.90)
        assert acc.ci_method == "paired_t"
        assert (acc.ci90.lower, acc.ci90.upper) == pytest.approx((ci.low, ci.high))
    else:
        iv = tango_interval(n01, n10, 400, 0.90)
        assert (acc.ci90.lower, acc.ci90.upper) == pytest.approx((iv.lower, iv.upper))
    # GSM8K at 0/30 in both arms: no information (the gate's verdict, printed), yet answer agreement moves.
    assert "gsm8k: inconclusive: no information" in stdout
    for filt in ("strict-match", "flexible-extract"):
        g = comp.estimate("gsm8k", "exact_match", filt)
        assert g.agreement.completion.agree == 29 and g.agreement.completion.n == 30
    assert comp.estimate("gsm8k", "exact_match", "flexible-extract").agreement.extracted.share == pytest.approx(29 / 30)


def test_compare_record_folders_with_distribution(tmp_path: Path, capsys) -> None:
    def tl(shift: float) -> TokenLogprobs:
        p = np.array([0.6 - shift, 0.3 + shift])
        return TokenLogprobs(target_ids=[1, 2, 1], target_logprobs=[math.log(0.6 - shift)] * 3,
                             topk_ids=[[1, 2]] * 3, topk_logprobs=[np.log(p).tolist()] * 3)

    for arm, shift in (("baseline", 0.0), ("candidate", 0.1)):
        recs = [SampleRecord(task="wikitext_kl", task_version="1", arm=arm, item_id=f"c{i}", prompt_hash=f"h{i}",
                             cluster=f"doc{i // 2}", token_logprobs=tl(shift)) for i in range(4)]
        recs += [SampleRecord(task="mmlu", task_version="1", arm=arm, item_id=str(i), prompt_hash=f"m{i}",
                              scores={"acc,none": float((i + (arm == "candidate") * (i % 7 == 0)) % 2)})
                 for i in range(60)]
        write_records(tmp_path / "records" / arm / "all.jsonl", recs)
    rc, _, err = run_cli(["compare", str(tmp_path / "records" / "baseline"), str(tmp_path / "records" / "candidate"),
                          "--out", str(tmp_path), "--bootstrap", "0"], capsys)
    assert rc == 0, err
    comp = load_comparison(tmp_path / "comparison.json")
    assert (comp.baseline, comp.candidate) == ("baseline", "candidate")
    metrics = {d.metric: d for d in comp.distribution}
    assert set(metrics) == {"kld", "top1_agree", "delta_p", "log_ppl_ratio"}
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.5, 0.4, 0.1])
    assert metrics["kld"].value == pytest.approx(float(np.sum(p * np.log(p / q))))
    assert metrics["delta_p"].value == pytest.approx(-0.1)
    assert metrics["kld"].n_chunks == 2 and metrics["kld"].filter == "none"
    assert comp.estimate("mmlu", "acc", "none").bootstrap is None


def test_mismatched_items_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    write_run(tmp_path / "base", {"arc_easy": mc_lines([1, 0, 1, 1])})
    write_run(tmp_path / "cand", {"arc_easy": mc_lines([1, 0, 1])})
    rc, _, err = run_cli(["compare", str(tmp_path / "base"), str(tmp_path / "cand"), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2
    assert err.startswith("error: task arc_easy: item sets differ") and err.count("\n") == 1
    assert "Traceback" not in err
    assert not (tmp_path / "o" / "comparison.json").exists()


def test_prompt_mismatch_between_lmeval_arms(tmp_path: Path, capsys) -> None:
    write_run(tmp_path / "base", {"arc_easy": mc_lines([1, 0, 1])})
    write_run(tmp_path / "cand", {"arc_easy": mc_lines([1, 0, 1], prompt_tag="System: be brief\n")})
    rc, _, err = run_cli(["compare", str(tmp_path / "base"), str(tmp_path / "cand"), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and "prompt hashes differ on 3 of 3 samples" in err and err.count("\n") == 1


@pytest.mark.parametrize("args", [["--bootstrap", "-1"], ["--margin", "0.02"], ["--policy", "missing.toml"]])
def test_bad_options_and_missing_folder_exit_2(tmp_path: Path, capsys, args: list[str]) -> None:
    write_run(tmp_path / "base", {"t": mc_lines([1])})
    rc, _, err = run_cli(["compare", str(tmp_path / "base"), str(tmp_path / "base"), "--out", str(tmp_path), *args], capsys)
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1
    rc, _, err = run_cli(["compare", str(tmp_path / "nope"), str(tmp_path / "base"), "--out", str(tmp_path)], capsys)
    assert rc == 2 and "no such folder" in err and err.count("\n") == 1


def test_plan_hand_computed(capsys) -> None:
    rc, out, _ = run_cli(["plan", "--task", "gpqa_diamond_zeroshot", "--margin", "0.05", "--rho", "0.5", "--n-items", "198"], capsys)
    assert rc == 0
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.8)
    sd = math.sqrt(2 * 0.25 * 0.5)  # accuracy 0.5, rho 0.5
    assert str(math.ceil((z * sd / 0.05) ** 2)) in out
    assert f"MDE {100 * z * sd / math.sqrt(198):.1f} pts" in out
    rc, _, err = run_cli(["plan", "--task", "x", "--margin", "0"], capsys)
    assert rc == 2 and err.startswith("error: --margin")
    rc, out, err = run_cli(["plan", "--task", "no_such_task", "--margin", "0.02"], capsys)
    assert rc == 2 and out == "" and err.startswith("error: --task 'no_such_task': unknown task") and err.count("\n") == 1
    rc, _, err = run_cli(["plan", "--task", "gsm8kk", "--margin", "0.02"], capsys)
    assert rc == 2 and "did you mean 'gsm8k'?" in err


def test_plan_from_pilot_comparison(lmeval_arms, tmp_path: Path, capsys) -> None:
    base, cand, a, b = lmeval_arms
    run_cli(["compare", str(base), str(cand), "--out", str(tmp_path / "o"), "--bootstrap", "0"], capsys)
    rc, out, _ = run_cli(["plan", "--task", "arc_easy", "--margin", "0.02", "--from", str(tmp_path / "o")], capsys)
    assert rc == 0
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.8)
    sd = float(np.std(b - a, ddof=1))
    assert str(math.ceil((z * sd / 0.02) ** 2)) in out
    rc, _, err = run_cli(["plan", "--task", "nope", "--margin", "0.02", "--from", str(tmp_path / "o")], capsys)
    assert rc == 2 and "no usable estimate for task 'nope'" in err


def test_compare_with_baseline_rerun_reports_floors(tmp_path: Path, capsys) -> None:
    a, b = paired_binary(200, seed=3)
    r, _ = paired_binary(200, seed=3)  # identical to the baseline: a deterministic engine
    for name, x in (("base", a), ("cand", b), ("rerun", r)):
        write_run(tmp_path / name, {"arc_easy": mc_lines(x)})
    rc, _, err = run_cli(["compare", str(tmp_path / "base"), str(tmp_path / "cand"), "--out", str(tmp_path / "o"),
                          "--rerun", str(tmp_path / "rerun"), "--bootstrap", "0"], capsys)
    assert rc == 0, err
    comp = load_comparison(tmp_path / "o")
    ef = comp.estimate("arc_easy", "acc", "none").excess_flips
    flips = int(np.sum(a != b))
    assert comp.rerun == "rerun"
    assert (ef.flips_rerun, ef.flips_candidate, ef.only_candidate) == (0, flips, flips)
    assert ef.p_excess == pytest.approx(0.5**flips)


def test_plan_api_repeats_shrink_within_item_noise() -> None:
    from qa.plan.sample_size import sample_size_plan as plan

    p = plan("gsm8k", 0.02, accuracy=0.35, rho=0.8, within_share=0.3, n_items=1319)
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.8)
    sd = math.sqrt(2 * 0.35 * 0.65 * 0.2)
    assert p.sd_diff == pytest.approx(sd)
    for row in p.rows:  # Var(dbar) = sd^2 (1 - W + W / K)
        assert row.items_needed == math.ceil((z * sd * math.sqrt(0.7 + 0.3 / row.repeats) / 0.02) ** 2)
    # at n = 1319: K >= sigma_w^2 / (n m^2 / z^2 - tau^2), sigma_w^2 = 0.3 sd^2, tau^2 = 0.7 sd^2
    assert p.repeats_needed_at_n == math.ceil(0.3 * sd**2 / (1319 * 0.02**2 / z**2 - 0.7 * sd**2))
    assert plan("t", 0.02).rows[0].repeats == 1 and len(plan("t", 0.02).rows) == 1
