"""The report's "Reference-answer signal" section: per task with reference answers (comparison.json
`reference`, qa.compare.reference), the items, the mean change in the reference tokens' log-probability
and the mean KL(baseline || candidate) over them (nats/token, 95% CIs), the A/A floor where a rerun arm
exists, and the gate's decision on them (qa.gate.reference); an engine without log-probs: "not available"."""

from __future__ import annotations

from qa.files.comparison import ReferenceEstimate, ReferenceStat
from qa.files.verdict import TaskVerdict
from qa.report.document import Paragraph, Section, line, table
from qa.report.gather import ReportInputs

TITLE = "Reference-answer signal"
HEADERS = ("task", "items", "delta log-prob (95% CI)", "KL (95% CI)", "KL p99", "A/A floor", "decision")
CAPTION = ("Each item's reference answer (GSM8K's solution, the gold choice, MATH-500's solution, the needle's "
           "value) teacher-forced after its prompt in both arms; per item the mean over its tokens, nats/token: "
           "delta = candidate - baseline (negative: the right answer became less likely), KL(baseline || "
           "candidate) over the top-k + tail. GPQA's reference text is never shown.")
NOT_AVAILABLE = "not available"


def _stat(stat: ReferenceStat | None, signed: bool) -> str:
    if stat is None:
        return "-"
    f = "+.4f" if signed else ".4f"
    ci = f" [{stat.ci95.lower:{f}}, {stat.ci95.upper:{f}}]" if stat.ci95 is not None else ""
    return f"{stat.value:{f}}{ci}"


def decision(tv: TaskVerdict | None) -> str:
    """The reference rules' outcome for one task: 'pass (decides)', 'fail (reported)', ... ('-': not gated)."""
    rules = [r for r in tv.rules if r.rule in ("reference_logprob", "reference_kl")] if tv is not None else []
    if not rules:
        return "-"
    statuses = [r.status for r in rules]
    status = "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"
    return f"{status} ({'decides' if any(r.decides for r in rules) else 'reported'})"


def reference_row(ref: ReferenceEstimate, tv: TaskVerdict | None) -> list[str]:
    """One row (HEADERS), plain text."""
    if ref.n == 0:
        return [ref.task, "0", NOT_AVAILABLE, NOT_AVAILABLE, "-", "-", NOT_AVAILABLE]
    floor = "-"
    if ref.floor_kld is not None and ref.floor_delta_logprob is not None:
        floor = f"delta {ref.floor_delta_logprob:+.4f}, KL {ref.floor_kld:.4f}"
    p99 = f"{ref.kld_p99:.4f}" if ref.kld_p99 is not None else "-"
    return [ref.task, f"{ref.n} ({ref.n_tokens} tokens)", _stat(ref.delta_logprob, True), _stat(ref.kld, False),
            p99, floor, decision(tv)]


def reference_rows(inp: ReportInputs) -> list[list[str]]:
    """Every task's row, in comparison order."""
    verdicts = {t.task: t for t in inp.verdict.tasks}
    return [reference_row(r, verdicts.get(r.task)) for r in inp.comparison.reference]


def section(inp: ReportInputs) -> Section | None:
    """The section: caption and table (None when no task has reference answers)."""
    rows = reference_rows(inp)
    return Section(TITLE, (Paragraph(line(CAPTION)), table(HEADERS, rows))) if rows else None
