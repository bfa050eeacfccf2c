"""The report's "Per turn depth and context length" section (comparison.json `slices`, qa.compare.slices): per
task whose records say where each item sits, one table per dimension (turn depth, context length, kind of turn
or subtask) on the gated "metric,filter" (else the task's first), the candidate's row beside the A/A control's
(the baseline rerun) at every slice."""

from __future__ import annotations

from qa.files.slices import SliceRow, SliceTable
from qa.report.document import Paragraph, Section, line, table
from qa.report.gather import ReportInputs
from qa.textfmt import percent, pts

TITLE = "Per turn depth and context length"
DIMENSIONS = {"turn": "Per turn depth", "length": "Per context length", "kind": "Per kind of turn / subtask"}
CAPTION = ("Each slice's paired units (a session task: its turns on the path named; delta = arm - baseline, 95% "
           "interval clustered by session). Tool calls valid: the output decodes as function calls. First "
           "divergence: where the arm's greedy output first differs from the baseline's, median over the outputs "
           "that differ, in characters (tokens estimated from them). Top-1 differs: units whose fixed teacher-forced "
           "continuation has a position where the arms' most likely tokens differ (median first position, tokens). "
           "KL(baseline || arm): nats/token on that continuation. Warm: the arm's own warm path in the slice (hit "
           "rate; outputs equal to its cold path). A/A: the baseline served again, the floor at the same slice.")
HEADERS = ("slice", "arm", "n (clusters)", "accuracy", "delta (95% CI)", "tool calls valid", "identical outputs",
           "first divergence", "top-1 differs", "KL (95% CI)", "warm hit rate", "warm = cold")


def _pct(x: float | None) -> str:
    return "-" if x is None else "0%" if x == 0 else percent(x)


def slice_cells(row: SliceRow) -> list[str]:
    """One row of a slice table (HEADERS), plain text."""
    arm = row.arm if row.role == "candidate" else f"A/A: {row.arm}"
    acc = "-" if row.mean_baseline is None else f"{_pct(row.mean_baseline)} -> {_pct(row.mean_arm)}"
    delta = "-" if row.delta is None else pts(row.delta) + (
        f" [{pts(row.ci95.lower)}, {pts(row.ci95.upper)}]" if row.ci95 is not None else "")
    valid = "-" if not row.tool_n else f"{_pct(row.valid_baseline)} -> {_pct(row.valid_arm)} of {row.tool_n}"
    div = "-" if row.first_divergence_chars is None else f"{row.first_divergence_chars:g} chars" + (
        f" (~{row.first_divergence_tokens:.0f} tokens)" if row.first_divergence_tokens is not None else "")
    top1 = "-" if row.top1_diverged is None else _pct(row.top1_diverged) + (
        f" (at {row.top1_first_position:g})" if row.top1_first_position is not None else "")
    kl = "-" if row.kld is None else f"{row.kld:.4g}" + (
        f" [{row.kld_ci95.lower:.4g}, {row.kld_ci95.upper:.4g}]" if row.kld_ci95 is not None else "")
    return [row.value, arm, f"{row.n} ({row.n_clusters})", acc, delta, valid, _pct(row.identical), div, top1, kl,
            _pct(row.warm_hit_rate), _pct(row.warm_identical)]


def shown_tables(inp: ReportInputs) -> list[SliceTable]:
    """The tables the report shows: per task and dimension, the gated metric's (else the task's first metric)."""
    gated = {t.task: t.metric for t in inp.verdict.tasks}
    out, seen = [], set()
    for t in inp.comparison.slices:
        metrics = [x.metric for x in inp.comparison.slices if (x.task, x.dimension) == (t.task, t.dimension)]
        want = gated.get(t.task) if gated.get(t.task) in metrics else metrics[0]
        if t.metric == want and (t.task, t.dimension) not in seen:
            seen.add((t.task, t.dimension))
            out.append(t)
    return out


def _heading(t: SliceTable) -> str:
    where = f", {t.path} path" if t.path else ""
    return f"{t.task}: {DIMENSIONS[t.dimension].lower()} ({t.metric}{where})"


def section(inp: ReportInputs) -> Section | None:
    """The section: the caption, then one subsection per shown table (None when no task has slices)."""
    tables = shown_tables(inp)
    if not tables:
        return None
    subs = [Section(_heading(t), (table(HEADERS, [slice_cells(r) for r in t.rows]),)) for t in tables]
    return Section(TITLE, (Paragraph(line(CAPTION)), *subs))
