"""The report's "Per turn depth and context length" section (qa.report.slices) in report.md and report.html
of a run directory holding hand-made agentic records and a baseline rerun: the candidate's row beside the
A/A row at each slice, the gated metric's table, escaping; absent for a run without slice meta."""

from __future__ import annotations

from pathlib import Path

from evals.records.samples import SampleRecord, write_records
from qa.compare.arms import compare_arms, load_arm
from qa.files.comparison import StatsSettings, save_comparison
from qa.report import render
from qa.report.slices import HEADERS, TITLE
from tests.qa.compare.slices_fixtures import arm


def _run(tmp_path: Path, base: list[SampleRecord], cand: list[SampleRecord],
         rerun: list[SampleRecord] | None = None) -> Path:
    run = tmp_path / "run"
    arms = {"baseline": base, "candidate": cand} | ({"baseline-rerun": rerun} if rerun is not None else {})
    for name, recs in arms.items():
        write_records(run / "records" / name / "agentic.jsonl", recs)
    comp = compare_arms(load_arm(run / "records" / "baseline"), load_arm(run / "records" / "candidate"),
                        StatsSettings(bootstrap_n=0),
                        rerun=load_arm(run / "records" / "baseline-rerun") if rerun is not None else None)
    save_comparison(run / "comparison.json", comp)
    return run


def test_slice_tables_with_the_aa_row_beside_the_candidate(tmp_path: Path) -> None:
    cand = arm("candidate", flips={(0, 1): 0.0, (1, 1): 0.0}, text={(2, 1): "<b>[f(a=2)]</b>"})
    paths = render(_run(tmp_path, arm("baseline"), cand, arm("baseline-rerun")))
    md, page = paths.markdown.read_text(), paths.html.read_text()
    assert f"## {TITLE}" in md and f"<h2>{TITLE}</h2>" in page
    assert "### agentic: per turn depth (exact_match,strict-match, cold path)" in md
    assert "| " + " | ".join(HEADERS) + " |" in md
    mine = md.split(f"## {TITLE}")[1].split("\n## ")[0]
    rows = [line for line in mine.splitlines() if line.startswith("| 1 | ")]
    assert [r.split(" | ")[1] for r in rows] == ["candidate", "A/A: baseline-rerun"]
    assert r"| 4 (4) | 100.0% -&gt; 50.0% | \-50.0 pts [-141.9 pts, +41.9 pts] |" in rows[0]
    assert "| 100.0% -&gt; 100.0% of 4 | 75.0% | 0 chars" in rows[0]  # tool calls valid; 3 of 4 outputs identical
    assert r"| 4 (4) | 100.0% -&gt; 100.0% | \+0.0 pts [+0.0 pts, +0.0 pts] |" in rows[1] and "| 68.3% | 100.0% |" in rows[1]
    assert "### agentic: per context length" in md and "| 1K-2K | candidate |" in md
    assert "### agentic: per kind of turn / subtask" in md and "| lookup | A/A: baseline-rerun |" in md
    section = page.split(f"<h2>{TITLE}</h2>")[1].split("<h2>")[0]
    assert "<b>" not in section and "<script" not in page


def test_no_section_without_slice_meta(tmp_path: Path) -> None:
    plain = [r.model_copy(update={"meta": {}, "item_id": r.item_id.replace("/", "-")}) for r in arm("baseline")]
    cand = [r.model_copy(update={"arm": "candidate"}) for r in plain]
    assert TITLE not in render(_run(tmp_path, plain, cand)).markdown.read_text()
