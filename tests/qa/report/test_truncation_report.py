"""Truncation in the report: a run whose candidate truncates more shows it next to accuracy (results
column), in a call-out, in the truncation and output-length table of report.md and report.html, and in
comparison.json; a run without truncation records shows none of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.records.samples import write_records
from qa.api import compare, gate
from qa.files.policy import default_policy
from qa.report import render
from qa.report.gather import gather
from qa.report.notes import truncation_notes
from qa.report.rows import GEN_HEADERS, HEADERS, generation_rows, table_row
from tests.qa.compare.generation_fixtures import flags, gen_records
from tests.qa.gate_fixtures import make_run_dir

N = 300
TASK = "gsm8k_cot_llama"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("trunc") / "run"
    # the candidate's extra truncated samples (items 3-59) lose their answer: even items 4..58 turn wrong
    lost = [0.0 if 3 <= i < 60 else float(i % 2 == 0) for i in range(N)]
    for arm, items, correct in (("baseline", range(3), None), ("candidate", range(60), lost)):
        write_records(run / "records" / arm / f"{TASK}.jsonl", gen_records(arm, flags(N, items), correct=correct))
    compare(run / "records" / "baseline", run / "records" / "candidate", out=run)
    gate(run, default_policy())
    render(run)
    return run


def test_comparison_json_carries_the_truncation(run: Path) -> None:
    data = json.loads((run / "comparison.json").read_text())
    (gen,) = data["generation"]
    assert (gen["task"], gen["baseline"]["truncated"], gen["candidate"]["truncated"]) == (TASK, 3, 60)
    assert gen["candidate"]["truncation_rate"] == pytest.approx(0.2)
    assert gen["truncation"]["delta"] == pytest.approx(57 / N)
    assert gen["output_tokens"]["delta"] == pytest.approx(192 * 57 / N)


def test_rows_show_truncation_next_to_accuracy(run: Path) -> None:
    inp = gather(run)
    tv = inp.verdict.tasks[0]
    gen = inp.comparison.generation_for(TASK)
    cells = table_row(tv, None if gen is None else gen.truncation, gen)
    assert len(cells) == len(HEADERS) and HEADERS[-1] == "truncated"
    assert cells[-1].main == "1.0% → 20.0%"
    assert cells[-1].sub.startswith("+19.0 pts, 90% CI [+15.") and cells[-1].sub.endswith("; fail")
    (row,) = generation_rows(inp.comparison, inp.verdict)
    assert len(row) == len(GEN_HEADERS)
    assert [c.main for c in row[:5]] == [TASK, "3 / 300 = 1.0%", "60 / 300 = 20.0%", "+19.0 pts", "fail"]
    assert row[5].main == f"{64 + 192 * 3 / N:.1f} → {64 + 192 * 60 / N:.1f}"
    assert row[6].main == f"{192 * 57 / N:+.1f}"
    (note,) = truncation_notes(inp)
    assert note.startswith(f"{TASK}: the candidate truncated 60 of 300 samples (20.0%), the baseline 3 (1.0%)")
    assert "truncation rule fail: candidate truncates more" in note
    assert next(r for r in tv.rules if r.rule == "noninferiority").status == "fail"  # 28 answers lost: -9.3 pts


def test_report_files_show_the_truncation(run: Path) -> None:
    md = (run / "report.md").read_text(encoding="utf-8")
    page = (run / "report.html").read_text(encoding="utf-8")
    assert md.startswith("# ❌ FAIL")
    assert f"**{TASK}** (exact_match,strict-match): candidate truncates more" in md
    assert f"> **Truncated outputs.** {TASK}: the candidate truncated 60 of 300 samples" in md
    assert "## Truncation and output length" in md and "| 60 / 300 = 20.0%<br>95% [" in md
    assert "1.0% → 20.0%" in md
    assert f"- {TASK} doc4#0 regression: target 42; baseline 42; candidate 7 (truncated: candidate)" in md
    assert "doc4#0 regression: target 42; baseline 42; candidate 7 (truncated: candidate)" in page
    assert "<b>Truncated outputs.</b>" in page and "<h2>Truncation and output length</h2>" in page
    assert "60 / 300 = 20.0%" in page and "1.0% → 20.0%" in page


def test_runs_without_truncation_records_show_no_truncation(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", kv=False)
    paths = render(run)
    md = paths.markdown.read_text(encoding="utf-8")
    assert "Truncation and output length" not in md and "Truncated outputs" not in md
    assert "Truncation and output length" not in paths.html.read_text(encoding="utf-8")
