"""The batch-invariance rule: the candidate's change rate between concurrency 1 and N against the baseline's.

Per task, the interval of delta = candidate rate - baseline rate (qa.compare.batch_invariance) at the policy's
level (1 - 2 alpha: the 90% interval at alpha 0.05) is read against the task's `batch_invariance_margin`:
pass when its upper end lies below the margin (the candidate moves at most `margin` more items than the
baseline when served under load), fail when its lower end lies above it, else inconclusive
(qa.gate.margin.interval_status). With no margin (the default) the rule is reported, never deciding. `qa gate` applies the deciding ones to the
verdict of a run folder holding batch_invariance.json (`qa invariance ALONE LOADED` writes it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from qa.compare.batch_invariance import BatchInvariance, TaskInvariance
from qa.files.comparison import Interval
from qa.files.policy import Policy
from qa.files.verdict import Verdict
from qa.gate.margin import interval_status
from qa.stats.paired_tests import tango_interval

InvarianceStatus = Literal["pass", "fail", "inconclusive", "reported"]


class InvarianceDecision(BaseModel):
    """One task's batch-invariance rule: its interval at the policy's level, the margin and the status."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: str
    delta: float
    level: float
    ci: Interval
    margin: float | None
    status: InvarianceStatus
    reason: str


def decide_task(row: TaskInvariance, margin: float | None, alpha: float) -> InvarianceDecision:
    """The rule for one task at one-sided `alpha` (the interval at level 1 - 2 alpha) against `margin`."""
    level = 1 - 2 * alpha
    ci = tango_interval(row.n01, row.n10, row.n, level)
    where = (f"{row.candidate_changed}/{row.n} items changed for the candidate, {row.baseline_changed}/{row.n} "
             f"for the baseline; delta {row.delta:+.3f}, {level:.0%} CI [{ci.lower:+.3f}, {ci.upper:+.3f}]")
    if margin is None:
        return InvarianceDecision(task=row.task, delta=row.delta, level=level, ci=ci, margin=None, status="reported",
                                  reason=f"{where} (no batch_invariance_margin: reported only)")
    status = interval_status(ci, below=margin)
    return InvarianceDecision(task=row.task, delta=row.delta, level=level, ci=ci, margin=margin, status=status,
                              reason=f"{where} against margin +{margin:.3f}")


def decide_invariance(inv: BatchInvariance, policy: Policy) -> list[InvarianceDecision]:
    """Every task's batch-invariance rule under its own policy entry (margin and alpha)."""
    out = []
    for row in inv.tasks:
        tp = policy.for_task(row.task)
        out.append(decide_task(row, tp.batch_invariance_margin, tp.alpha))
    return out


def apply_invariance(verdict: Verdict, decisions: list[InvarianceDecision]) -> Verdict:
    """The verdict with the deciding batch-invariance rules applied (a task's margin set): any fail fails it, any
    inconclusive leaves a passing verdict inconclusive; reported-only rules leave it as it is."""
    deciding = [d for d in decisions if d.status != "reported"]
    if not deciding:
        return verdict
    worst = "fail" if any(d.status == "fail" for d in deciding) else (
        "inconclusive" if any(d.status == "inconclusive" for d in deciding) else "pass")
    lines = "; ".join(f"batch invariance {d.task} {d.status}: {d.reason}" for d in deciding if d.status != "pass")
    status = "fail" if "fail" in (worst, verdict.status) else (
        "inconclusive" if "inconclusive" in (worst, verdict.status) else "pass")
    if status == verdict.status and not lines:
        return verdict
    summary = f"{status.upper()}: {lines}; {verdict.summary}" if lines else verdict.summary
    return verdict.model_copy(update={"status": status, "summary": summary})
