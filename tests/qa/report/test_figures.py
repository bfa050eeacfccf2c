"""qa.report.figures: the forest plot's thick bar is the interval the gate decided on, at its level."""

from __future__ import annotations

from pathlib import Path

from qa.files.policy import parse_policy
from qa.report.figures import forest_rows, make_figures
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
    assert figs.kv is None and set(figs.files()) == {"forest", "flips"} and len(figs.kl) == 1
