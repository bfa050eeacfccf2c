"""The report's "Sequential looks" section (qa.report.sequential) in report.md and report.html: per task the
looks with their critical values, adjusted levels and intervals, where the task stopped and how many items
that saved. The looks are computed with the gate's own look_decision on hand-made records (a destructive
candidate on one task, an identical one on another) filtered to each look's first items in the seeded order,
as qa.pipeline.sequential does; the end-to-end run is tests/qa/pipeline/test_sequential.py."""

from __future__ import annotations

from pathlib import Path

from evals.records.samples import SampleRecord, write_records
from evals.run.selection import select_items
from evals.tasks.base import Item
from qa.compare.arms import Arm, compare_arms
from qa.files.comparison import SequentialLook, StatsSettings, load_comparison, save_comparison
from qa.files.policy import Policy, TaskPolicy
from qa.gate.rules import select_estimate
from qa.gate.sequential import look_decision, sequential_task
from qa.report import render
from qa.report.sequential import HEADERS
from qa.textfmt import percent

N, SEED = 40, 3
TP = TaskPolicy(margin=0.05, min_n=10, looks=(0.25, 0.5, 0.75, 1.0), spending="obrien_fleming")
POLICY = Policy(name="sequential-report", default=TP)
ITEMS = [Item(item_id=f"q{i:02d}", doc={}) for i in range(N)]


def _records(arm: str, task: str, wrong: set[str]) -> list[SampleRecord]:
    return [SampleRecord(task=task, task_version="1", arm=arm, item_id=it.item_id, prompt_hash=f"h{it.item_id}",
                         scores={"acc,none": 0.0 if it.item_id in wrong else 1.0}) for it in ITEMS]


def _run(tmp_path: Path) -> Path:
    """Two tasks: `broken` loses 30 of 40 items in the candidate, `same` none; looks as qa.pipeline.sequential makes them."""
    run = tmp_path / "run"
    broken = {it.item_id for it in ITEMS[::4]} ^ {it.item_id for it in ITEMS}  # 30 of 40 wrong
    arms = {arm: _records(arm, "broken", broken if arm == "candidate" else set()) + _records(arm, "same", set())
            for arm in ("baseline", "candidate")}
    for arm, recs in arms.items():
        write_records(run / "records" / arm / "all.jsonl", recs)
    sizes = (10, 20, 30, 40)
    looks: dict[str, list[SequentialLook]] = {"broken": [], "same": []}
    done: dict[str, object] = {}
    for k, n in enumerate(sizes):
        first = {it.item_id for it in select_items(ITEMS, n, SEED)}
        pick = {a: Arm(a, "records", tuple(r for r in recs if r.item_id in first)) for a, recs in arms.items()}
        comp = compare_arms(pick["baseline"], pick["candidate"], StatsSettings(bootstrap_n=0))
        for task in [t for t in looks if t not in done]:
            est = select_estimate(comp, task, TP, explicit=False)
            looks[task].append(look_decision(est, TP, k, N))
            if looks[task][-1].decision != "continue" or k == len(sizes) - 1:
                done[task] = (sequential_task(est, TP, looks[task], N), first)
    keep = {t: first for t, (_, first) in done.items()}  # type: ignore[misc]
    final = {a: Arm(a, "records", tuple(r for r in recs if r.item_id in keep[r.task])) for a, recs in arms.items()}
    comp = compare_arms(final["baseline"], final["candidate"], StatsSettings(bootstrap_n=0))
    save_comparison(run / "comparison.json", comp.model_copy(update={"sequential": [s for s, _ in done.values()]}))
    return run


def test_sequential_looks_section_in_markdown_and_html(tmp_path: Path) -> None:
    run = _run(tmp_path)
    seq = {s.task: s for s in load_comparison(run / "comparison.json").sequential}
    b = seq["broken"]
    assert b.decision == "fail" and b.stopped_at is not None and b.stopped_at < 3  # a 75-point drop stops early
    assert seq["same"].decision == "final"
    paths = render(run, POLICY)
    md, page = paths.markdown.read_text(), paths.html.read_text()
    assert "## Sequential looks" in md and "<h2>Sequential looks</h2>" in page
    assert "| " + " | ".join(HEADERS) + " |" in md
    stop = (f"stopped at look {b.stopped_at + 1} of 4 with fail; {b.items_used} of 40 items used, "
            f"{b.items_saved} saved ({percent(b.items_saved / 40)})")
    assert stop in next(line for line in md.splitlines() if line.startswith("- broken"))
    same = next(line for line in md.splitlines() if line.startswith("- same"))
    assert "ran to the last look (4)" in same and "40 of 40 items used" in same
    assert f"Items saved by stopping early: {b.items_saved} of 80 planned ({percent(b.items_saved / 80)})" in md
    rows = [line for line in md.splitlines() if line.startswith(("| broken |", "| same |", "|  |"))]
    assert len(rows) == b.stopped_at + 1 + 4  # broken: its looks up to the stop; same: all four
    last = b.looks[-1]
    assert rows[b.stopped_at].endswith(f"| {100 * last.adjusted_level:.2f}% | [{100 * last.lower:+.1f}, "
                                       f"{100 * last.upper:+.1f}] pts | fail |")
    assert rows[0].startswith(f"| broken | 1 of 4 | {b.looks[0].n} ({b.looks[0].fraction:.2f}) |")
    section = page.split("<h2>Sequential looks</h2>")[1].split("<h2>")[0]
    assert "<td>fail</td>" in section and stop in section
    assert "<script" not in page


def test_no_section_without_looks(tmp_path: Path) -> None:
    run = _run(tmp_path)
    comp_path = run / "comparison.json"
    save_comparison(comp_path, load_comparison(comp_path).model_copy(update={"sequential": []}))
    paths = render(run, Policy(name="fixed"))
    assert "Sequential looks" not in paths.markdown.read_text()
    assert "Sequential looks" not in paths.html.read_text()
