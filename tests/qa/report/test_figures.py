"""qa.report.figures: the forest plot's thick bar is the interval the gate decided on, at its level; a task
decided on its reference answers has rows for the reference rules that decided it, in nats/token."""

from __future__ import annotations

from pathlib import Path

from qa.files.policy import parse_policy
from qa.report.figures import forest_rows, make_figures, reference_rows
from qa.report.gather import gather
from qa.stats.intervals import delta_interval
from tests.qa.gate_fixtures import make_run_dir


def test_forest_rows_carry_the_gates_interval_at_the_policys_level(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", kv=False)
    inp = gather(run, parse_policy('name = "a"\n[default]\nalpha = 0.025'))
    rows = {r.label: r for r in forest_rows(inp)}
    arc = inp.comparison.estimates[0]
    assert arc.task == "arc_challenge" and arc.ci95 is not None
    want = delta_interval(arc, 0.95)
    assert want is not None
    assert rows["arc_challenge"].gate_level == 0.95
    assert rows["arc_challenge"].ci_gate == (want.lower, want.upper)
    assert rows["arc_challenge"].ci_gate == (arc.ci95.lower, arc.ci95.upper)  # the stored 95% at alpha 0.025


def test_figures_without_kv_have_no_kv_file(tmp_path: Path) -> None:
    figs = make_figures(gather(make_run_dir(tmp_path / "run", kv=False)))
    assert figs.kv is None and set(figs.files()) == {"forest", "flips", "kl-1"} and len(figs.kl) == 1


MAIN_JOB = Path(__file__).resolve().parents[3] / "reports" / "main_job"


def test_a_task_decided_on_its_reference_answers_draws_the_interval_that_decided_it() -> None:
    """The committed main job: GSM8K (accuracy at the floor in both arms) passes on its reference answers; the
    forest plot's reference rows carry the deciding rules' intervals in nats/token against their bounds."""
    inp = gather(MAIN_JOB)
    gsm8k = next(t for t in inp.verdict.tasks if t.task == "gsm8k")
    assert gsm8k.status == "pass" and "decided on the reference answers" in gsm8k.reason
    rows = {r.label: r for r in reference_rows(inp)}
    assert set(rows) == {f"{t}: {x}" for t in ("gsm8k", "gpqa_diamond_zeroshot") for x in ("delta log-prob", "KL")}
    for name, sign in (("reference_logprob", -1), ("reference_kl", 1)):
        decided = next(r for r in gsm8k.rules if r.rule == name)
        row = rows[f"gsm8k: {'delta log-prob' if sign < 0 else 'KL'}"]
        assert decided.decides and decided.ci is not None and decided.margin is not None
        assert row.ci_gate == (decided.ci.lower, decided.ci.upper) and row.gate_level == decided.ci_level
        assert row.bound == sign * decided.margin and row.status == decided.status == "pass"
    assert row.ci_gate[1] < row.bound  # KL's interval lies below +margin: the pass that decided GSM8K
    accuracy = {r.label: r for r in forest_rows(inp)}["gsm8k"]
    assert accuracy.status == "inconclusive"  # the accuracy bar straddles its margin: drawn as its rule says
    forest = make_figures(inp).forest
    assert forest is not None and forest.png[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_reference_rows_where_accuracy_decides(tmp_path: Path) -> None:
    inp = gather(make_run_dir(tmp_path / "run", kv=False))
    assert reference_rows(inp) == []
    assert {r.label: r.status for r in forest_rows(inp)} == {t.task: t.status for t in inp.verdict.tasks
                                                             if t.delta is not None}
