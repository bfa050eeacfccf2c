"""The report's "Batch invariance" section: per task, the items whose outcome changes between concurrency 1 and
N for the baseline and for the candidate (batch_invariance.json in the run folder, qa.compare.batch_invariance),
their paired difference with its interval, the reference answer's log-prob shift, and the rule's decision under
the verdict's policy (qa.gate.batch_invariance). No file: no section."""

from __future__ import annotations

from qa.compare.batch_invariance import INVARIANCE_FILE, BatchInvariance, TaskInvariance
from qa.gate.batch_invariance import InvarianceDecision, decide_invariance
from qa.report.document import Paragraph, Section, line, table
from qa.report.gather import ReportInputs

TITLE = "Batch invariance"
HEADERS = ("task", "items", "baseline changed", "candidate changed", "delta (95% CI)",
           "ref. log-prob shift, base / cand (nats/token)", "decision")
CAPTION = ("Each arm served alone (concurrency 1) and under load (concurrency N, filler requests beside every "
           "evaluated one, vLLM's own scheduler). An item is changed when its outcome (scores, extracted answer, "
           "failure) differs between the two levels. delta = candidate's change rate - baseline's, paired on items "
           "(Tango's interval); positive: the candidate's answers move under load where the baseline's do not.")


def invariance_row(row: TaskInvariance, decided: InvarianceDecision) -> list[str]:
    """One row (HEADERS), plain text."""
    ref = "-"
    if row.reference is not None:
        ref = f"{row.reference.baseline:.4f} / {row.reference.candidate:.4f}"
    return [row.task, str(row.n), f"{row.baseline_changed} ({row.baseline_rate:.1%})",
            f"{row.candidate_changed} ({row.candidate_rate:.1%})",
            f"{row.delta:+.3f} [{row.ci95.lower:+.3f}, {row.ci95.upper:+.3f}]", ref,
            decided.status if decided.margin is None else f"{decided.status} (margin +{decided.margin:.3f})"]


def invariance_rows(inp: ReportInputs) -> list[list[str]]:
    """Every task's row; none when the run folder has no batch_invariance.json."""
    path = inp.run_dir / INVARIANCE_FILE
    if not path.is_file():
        return []
    inv = BatchInvariance.load(path)
    return [invariance_row(r, d) for r, d in zip(inv.tasks, decide_invariance(inv, inp.verdict.policy))]


def section(inp: ReportInputs) -> Section | None:
    """The section: caption and table (None without batch_invariance.json)."""
    rows = invariance_rows(inp)
    return Section(TITLE, (Paragraph(line(CAPTION)), table(HEADERS, rows))) if rows else None
