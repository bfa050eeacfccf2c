"""The power plan (qa.plan.power): its numbers against qa.stats.power and hand-checked values, priors from the
table (each checked against the committed report it names) and from an earlier run directory,
reachable / unreachable, `--strict-plan` and bad priors exit 2, and `qa run --dry-run` prints the table."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from qa.files.comparison import load_comparison
from qa.files.policy import TaskPolicy, default_policy, parse_policy
from qa.gate.rules import no_information, select_estimate
from qa.plan.power import (
    PlanError,
    PlanOptions,
    default_prior,
    parse_prior_options,
    plan_run,
    table_priors,
)
from qa.stats.power import items_needed, z_total
from tests.qa.cli.test_compare_cmd import run_cli
from tests.shared_data import shared_data_dir

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "reports" / "reference"
MODEL = "smollm2-135m"
MAIN = ROOT / "examples" / "smollm2_nvfp4_kv.toml"


@dataclass(frozen=True)
class Counted:
    """A task as a run counts it (qa.plan.power.CountedTask)."""

    name: str
    items_available: int
    n_items: int
    repeats: int
    sampled: bool = False


def _plans(counts: list[Counted], options: PlanOptions | None = None, model: str = MODEL,
           policy_text: str | None = None) -> dict:
    policy = parse_policy(policy_text) if policy_text is not None else default_policy()
    return {t.task: t for t in plan_run(counts, policy, model, options).tasks}


def test_every_table_prior_is_the_gated_estimate_of_the_report_it_names() -> None:
    table, _ = table_priors()
    data = tomllib.loads((ROOT / "qa" / "policies" / "plan_priors.toml").read_text(encoding="utf-8"))
    policy = default_policy()
    assert set(table) == {"arc_challenge", "gpqa_diamond_zeroshot", "wikitext_kl", "needle", "gsm8k"}
    for task, row in data["tasks"].items():
        run = ROOT / Path(row["source"]).parent
        est = select_estimate(load_comparison(run / "comparison.json"), task, policy.for_task(task), task in policy.tasks)
        assert est.sd_diff == pytest.approx(row["sd_diff"], rel=1e-4), task
        assert (est.n, est.repeats, f"{est.metric},{est.filter}") == (row["n"], row["repeats"], row["metric"])
        assert tomllib.loads((run / "spec.toml").read_text(encoding="utf-8"))["model"] == row["model"]
        assert (no_information(est) is not None) == ("no_information" in row), task  # only gsm8k: the floor
        if "reference" in row:  # the reference-answer signal: per-item sds = SE * sqrt(n) of the run it names
            ref_row = row["reference"]
            ref = next(r for r in load_comparison(ROOT / ref_row["source"]).reference if r.task == task)
            assert ref.n == ref_row["n"] and ref.delta_logprob is not None and ref.kld is not None
            assert ref.delta_logprob.se * math.sqrt(ref.n) == pytest.approx(ref_row["sd_logprob"], rel=1e-4)
            assert ref.kld.value == pytest.approx(ref_row["kl"], rel=1e-4)
            assert ref.kld.se * math.sqrt(ref.n) == pytest.approx(ref_row["sd_kl"], rel=1e-4)
            assert table[task].reference is not None and table[task].reference.n == ref_row["n"]


def test_mde_and_items_needed_are_qa_stats_power_and_the_hand_values() -> None:
    plans = _plans([Counted("gpqa_diamond_zeroshot", 198, 198, 1), Counted("arc_challenge", 1172, 300, 1)])
    gpqa, arc = plans["gpqa_diamond_zeroshot"], plans["arc_challenge"]
    z = z_total(0.05, 0.8)
    assert z == pytest.approx(1.644854 + 0.841621, abs=1e-5)
    assert gpqa.mde == pytest.approx(z * 0.33985 / math.sqrt(198))
    assert gpqa.mde == pytest.approx(0.0600, abs=5e-4)  # the gate's "MDE 6.0 pts" on the same run
    assert gpqa.items_needed == items_needed(0.33985, 0.02, 0.05, 0.8) == 1786  # ceil((2.4865 * 0.33985 / 0.02)^2)
    assert gpqa.reachable is False and "more than the task offers (198)" in gpqa.why_unreachable()
    assert arc.mde == pytest.approx(0.0173, abs=5e-4) and arc.items_needed == 225  # ceil(224.4)
    assert arc.reachable is True


def test_min_n_and_margin_decide_reachability_as_the_gate_does() -> None:
    policy = ('version = 1\n[default]\nmargin = 0.02\n[tasks.gpqa_diamond_zeroshot]\nmargin = 0.07\n'
              '[tasks.arc_challenge]\nmin_n = 400\n')
    plans = _plans([Counted("gpqa_diamond_zeroshot", 198, 198, 1), Counted("arc_challenge", 1172, 300, 1),
                    Counted("needle", 18, 18, 1)], policy_text=policy)
    gpqa, arc, needle = plans["gpqa_diamond_zeroshot"], plans["arc_challenge"], plans["needle"]
    assert gpqa.margin == 0.07 and gpqa.reachable is True
    assert gpqa.items_needed == max(50, math.ceil((z_total(0.05, 0.8) * 0.33985 / 0.07) ** 2)) == 146
    assert arc.reachable is False and arc.items_needed == 400 and "n = 300 < min_n 400" in arc.why_unreachable()
    assert needle.reachable is False and "n = 18 < min_n 50" in needle.why_unreachable()


def test_an_earlier_run_of_the_same_model_wins_over_the_table() -> None:
    counts = [Counted("arc_challenge", 1172, 100, 1), Counted("mmlu", 14042, 100, 1)]
    plans = _plans(counts, PlanOptions(from_run=REFERENCE))
    assert plans["arc_challenge"].source.startswith(str(REFERENCE))
    assert plans["arc_challenge"].sd == pytest.approx(0.120486, rel=1e-4)
    assert plans["mmlu"].sd == pytest.approx(math.sqrt(0.15)) and plans["mmlu"].source.startswith("default")
    explicit = _plans(counts, PlanOptions(priors={"arc_challenge": 0.05}, from_run=REFERENCE))["arc_challenge"]
    assert (explicit.sd, explicit.source) == (0.05, "--plan-prior")


def test_an_earlier_run_must_be_of_the_same_model_and_hold_a_comparison(tmp_path: Path) -> None:
    counts = [Counted("arc_challenge", 1172, 100, 1)]
    with pytest.raises(PlanError, match="model is 'smollm2-135m', this spec's 'other-model'"):
        _plans(counts, PlanOptions(from_run=REFERENCE), model="other-model")
    with pytest.raises(PlanError, match="no comparison.json there"):
        _plans(counts, PlanOptions(from_run=tmp_path))


def test_no_information_is_not_planned_for_that_model_and_defaults_elsewhere() -> None:
    counts = [Counted("gsm8k", 1319, 16, 1)]
    same = _plans(counts)["gsm8k"]
    assert not same.planned and same.reachable is None and "no information" in same.note
    other = _plans(counts, model="another-model")["gsm8k"]
    assert other.planned and other.sd == pytest.approx(math.sqrt(0.15))


def test_sampled_tasks_use_qa_plans_model_with_repeats() -> None:
    _, defaults = table_priors()
    prior = default_prior(defaults, 8, sampled=True)
    assert prior.sd == pytest.approx(math.sqrt(2 * 0.25 * 0.4) * math.sqrt(0.5 + 0.5 / 8))  # 0.335
    plan = _plans([Counted("gpqa_diamond_zeroshot", 198, 198, 8, sampled=True)],
                  policy_text="version = 1\n[tasks.gpqa_diamond_zeroshot]\nmargin = 0.07\n")["gpqa_diamond_zeroshot"]
    assert plan.sd == pytest.approx(prior.sd) and plan.reachable is True  # the table's greedy value is not used


@pytest.mark.parametrize("value", ["gsm8k=-0.1", "gsm8k=0", "gsm8k=abc", "gsm8k=nan", "gsm8k", "=0.2"])
def test_a_prior_that_is_not_a_positive_number_is_refused(value: str) -> None:
    with pytest.raises(PlanError, match="--plan-prior"):
        parse_prior_options([value])


def test_a_prior_for_a_task_the_spec_lacks_is_refused() -> None:
    with pytest.raises(PlanError, match="no task 'gsm8' in the spec; did you mean 'gsm8k'"):
        _plans([Counted("gsm8k", 1319, 16, 1)], PlanOptions(priors={"gsm8": 0.2}))


SPEC = ('name = "plan-cli"\nmodel = "smollm2-135m"\n[arms.baseline]\nengine = "hf"\n[arms.candidate]\nengine = "hf"\n'
        '[[tasks]]\nname = "arc_challenge"\nlimit = 300\n[[tasks]]\nname = "needle"\n'
        'options = { lengths = [256], depths = [0.5], per_cell = 4 }\n')


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(SPEC, encoding="utf-8")
    return path


def test_dry_run_prints_the_plan_and_warns(spec_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = shared_data_dir("arc_challenge")
    rc, out, err = run_cli(["run", str(spec_file), "--dry-run", "--data-dir", str(data)], capsys)
    assert rc == 0, err
    assert "power plan (before any arm starts):" in out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("arc_challenge  acc,none"))
    assert row[2:5] == ["300", "1", "2.0"] and row[-2:] == ["yes", "225"]
    assert "warning: plan: needle: margin unreachable at 4 items (n = 4 < min_n 50" in out
    rc, out, _ = run_cli(["run", str(spec_file), "--dry-run", "--data-dir", str(data),
                          "--plan-prior", "needle=0.001", "--plan-prior", "arc_challenge=0.5"], capsys)
    assert rc == 0 and "arc_challenge: prior --plan-prior" in out
    assert "warning: plan: arc_challenge: margin unreachable at 300 items (MDE 7.2 pts > margin 2.0 pts" in out


def test_strict_plan_and_bad_priors_exit_2_in_one_line(spec_file: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    data = str(shared_data_dir("arc_challenge"))
    rc, out, err = run_cli(["run", str(spec_file), "--dry-run", "--data-dir", data, "--strict-plan"], capsys)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: --strict-plan: needle: margin unreachable")
    assert "arc_challenge  acc,none" in out  # the table comes first
    out_dir = tmp_path / "run"
    rc, _, err = run_cli(["run", str(spec_file), "--out", str(out_dir), "--data-dir", data, "--strict-plan"], capsys)
    assert rc == 2 and "--strict-plan: needle" in err
    assert not (out_dir / "env.json").exists() and not (out_dir / "records").exists()  # refused before any arm
    for bad in (["--plan-prior", "needle=-1"], ["--plan-prior", "needle=x"], ["--plan-prior", "nedle=0.1"],
                ["--plan-from", str(tmp_path)]):
        rc, _, err = run_cli(["run", str(spec_file), "--dry-run", "--data-dir", data, *bad], capsys)
        assert rc == 2 and err.count("\n") == 1 and err.startswith("error: --plan-"), (bad, err)


def test_a_no_information_task_is_planned_on_the_reference_answers_of_an_earlier_run(tmp_path: Path) -> None:
    from qa.files.comparison import ReferenceEstimate, ReferenceStat, save_comparison

    comparison = load_comparison(REFERENCE / "comparison.json")
    ref = ReferenceEstimate(task="gsm8k", n=48, n_clusters=48, n_tokens=4800, n_missing=0,
                            delta_logprob=ReferenceStat(value=-0.01, se=0.004, df=47, ci95=None),
                            kld=ReferenceStat(value=0.02, se=0.002, df=47, ci95=None))
    save_comparison(tmp_path / "comparison.json", comparison.model_copy(update={"reference": [ref]}))
    (tmp_path / "spec.toml").write_text((REFERENCE / "spec.toml").read_text(encoding="utf-8"), encoding="utf-8")
    z = z_total(0.05, 0.8) / math.sqrt(16)
    sd_lp, sd_kl = 0.004 * math.sqrt(48), 0.002 * math.sqrt(48)
    assert z * sd_lp < 0.05 and 0.02 + z * sd_kl < 0.05  # hand check: 0.0172 and 0.0286
    plan = _plans([Counted("gsm8k", 1319, 16, 1)], PlanOptions(from_run=tmp_path))["gsm8k"]
    margin = TaskPolicy().reference_logprob_margin  # the default policy's (the plan reads the spec's policy)
    assert plan.reference_reachable is True and f"MDE {z * sd_lp:.4f} vs margin {margin:g}" in plan.note
    assert f"KL 0.0200 + MDE {z * sd_kl:.4f}" in plan.note
    tight = "version = 1\n[default]\nreference_kl_margin = 0.03\n"
    assert _plans([Counted("gsm8k", 1319, 16, 1)], PlanOptions(from_run=tmp_path), policy_text=tight)[
        "gsm8k"].reference_reachable is True  # KL upper 0.02 + 0.0086 < 0.03
    few = plan_run([Counted("gsm8k", 1319, 2, 1)], parse_policy(tight), MODEL, PlanOptions(from_run=tmp_path))
    assert few.tasks[0].reference_reachable is False  # 2 items: 0.02 + 0.0244 > 0.03
    assert "KL 0.0200 + MDE 0.0244 vs margin 0.03 nats/token (sds from 48 items): unreachable" in few.warnings()[0]
