"""The report's "Sequential looks" section: per task of a sequential run (comparison.json `sequential`,
written by qa.pipeline.sequential), each look's items, critical value, adjusted level, interval of delta and
decision; where the task stopped and how many items that saved; and the items saved over all tasks."""

from __future__ import annotations

from qa.files.comparison import SequentialLook, SequentialTask
from qa.report.document import Paragraph, Section, bullets, line, table
from qa.report.gather import ReportInputs
from qa.textfmt import percent

TITLE = "Sequential looks"
HEADERS = ("task", "look", "items (fraction)", "z crit", "level", "adjusted CI of delta", "decision")
HOW = ("Both arms ran the same items in blocks in the seeded item order, and the gate looked after each block: "
       "a task stops with pass when the lower limit of the adjusted interval of delta lies above -margin, with "
       "fail when its upper limit lies below -margin, else it goes on; at the last look the gate decides as at "
       "fixed n, at the adjusted level. The level at each look comes from the spending function (z crit is "
       "one-sided).")


def _ci(look: SequentialLook) -> str:
    if look.lower is None or look.upper is None:
        return "undefined"
    return f"[{100 * look.lower:+.1f}, {100 * look.upper:+.1f}] pts"


def look_rows(seq: SequentialTask, planned: int) -> list[list[str]]:
    """One row per look of a task (HEADERS), plain text; `planned`: the policy's number of looks."""
    return [[seq.task if i == 0 else "", f"{lk.look + 1} of {planned}", f"{lk.n} ({lk.fraction:.2f})",
             f"{lk.z_crit:.3f}", f"{100 * lk.adjusted_level:.2f}%", _ci(lk), lk.decision]
            for i, lk in enumerate(seq.looks)]


def task_line(seq: SequentialTask, planned: int, margin: float) -> str:
    """Where the task stopped and what that saved, in one sentence."""
    head = f"{seq.task} ({seq.metric},{seq.filter}; {seq.spending}, margin -{100 * margin:.1f} pts)"
    used = f"{seq.items_used} of {seq.n_planned} items used"
    if seq.stopped_at is not None:
        saved = percent(seq.items_saved / seq.n_planned) if seq.n_planned else "-"
        return (f"{head}: stopped at look {seq.stopped_at + 1} of {planned} with {seq.decision}; {used}, "
                f"{seq.items_saved} saved ({saved})")
    if seq.decision == "final":
        return f"{head}: ran to the last look ({planned}); the gate decided there at the adjusted level; {used}"
    return f"{head}: {len(seq.looks)} of {planned} looks so far, no decision yet; {used}"


def total_line(tasks: list[SequentialTask]) -> str:
    """Items saved over every sequential task."""
    planned = sum(s.n_planned for s in tasks)
    saved = sum(s.items_saved for s in tasks)
    share = percent(saved / planned) if planned else "-"
    return f"Items saved by stopping early: {saved} of {planned} planned ({share}) over {len(tasks)} task(s)."


def _planned(inp: ReportInputs, seq: SequentialTask) -> tuple[int, float]:
    tp = inp.verdict.policy.for_task(seq.task)
    return (len(tp.looks) or len(seq.looks)), tp.margin


def section(inp: ReportInputs) -> Section | None:
    """The section: how the looks work, one line per task, the items saved and every look's row (None when
    the run had no sequential looks)."""
    tasks = inp.comparison.sequential
    if not tasks:
        return None
    rows = [row for s in tasks for row in look_rows(s, _planned(inp, s)[0])]
    return Section(TITLE, (Paragraph(line(HOW)), bullets([task_line(s, *_planned(inp, s)) for s in tasks]),
                           Paragraph(line(total_line(tasks))), table(HEADERS, rows)))
