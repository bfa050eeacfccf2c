"""The reference-answer rules: non-inferiority of the teacher-forced reference answers (qa.compare.reference),
in nats per token, on the (1 - 2 alpha) t interval of each mean over items.

- reference_logprob: pass iff the interval's lower limit of delta_logprob (candidate - baseline) lies
  above -reference_logprob_margin; fail iff its upper limit lies below it;
- reference_kl: pass iff the upper limit of the mean KL(baseline || candidate) lies below
  reference_kl_margin; fail iff its lower limit lies above it.

Both are always computed and reported where the records hold reference answers. They decide when the
policy's `reference_gate` says so: "when_no_information" (the default: accuracy cannot compare the arms,
rules.no_information, so the reference signal decides the task alone), "always" (they decide beside the
accuracy rules: every deciding rule must pass), "instead_of_accuracy" (they decide the task, chosen before
the run for a task whose accuracy cannot decide at the items that fit, as GPQA diamond on a small model:
accuracy is reported, and only an accuracy fail, a CI wholly below its margin, still fails the task) or
"never" (reported only). A task whose engines gave no log-probs is reported "not available" and stays as
accuracy decided it.
"""

from __future__ import annotations

from qa.files.comparison import Comparison, Interval, ReferenceEstimate, ReferenceStat
from qa.files.policy import TaskPolicy
from qa.files.verdict import RuleName, RuleResult, Status, TaskVerdict
from qa.gate.margin import interval_status
from qa.stats.basic import t_interval


def stat_interval(stat: ReferenceStat | None, level: float) -> Interval | None:
    """value -/+ t_{df, (1 + level) / 2} * se (qa.stats.basic.t_interval; None when the SE is undefined)."""
    if stat is None or stat.se is None or stat.df is None or stat.df < 1:
        return None
    return t_interval(stat.value, stat.se, stat.df, level)


def nats_ci(ci: Interval, level: float, signed: bool = True) -> str:
    """'90% CI [-0.0123, +0.0045]' in nats per token (signed: with explicit + signs)."""
    f = "+.4f" if signed else ".4f"
    return f"{100 * level:.0f}% CI [{ci.lower:{f}}, {ci.upper:{f}}]"


def _bound_rule(rule: RuleName, stat: ReferenceStat | None, bound: float, higher_is_better: bool, text: str,
                worse: str, decides: bool, tp: TaskPolicy) -> RuleResult:
    """Non-inferiority against `bound` on the (1 - 2 alpha) interval: higher_is_better -> pass iff the lower
    limit lies above it, fail iff the upper limit lies below it; else the mirror image."""
    level = 1 - 2 * tp.alpha
    ci = stat_interval(stat, level)
    common = {"rule": rule, "decides": decides, "ci_level": level, "ci": ci, "margin": abs(bound),
              "ci_method": "cluster_cr1_t"}
    if ci is None:
        return RuleResult(**common, status="inconclusive", detail=f"{text}: CI undefined (too few items)")
    text = f"{text} {nats_ci(ci, level, signed=higher_is_better)} nats/token"
    status = interval_status(ci, above=bound) if higher_is_better else interval_status(ci, below=bound)
    side = ("above", "below") if higher_is_better else ("below", "above")
    detail = {"pass": f"{text} lies {side[0]} {bound:g}", "fail": f"{worse}: {text} lies {side[1]} {bound:g}",
              "inconclusive": f"{text} straddles {bound:g}"}[status]
    return RuleResult(**common, status=status, detail=detail)


def logprob_rule(ref: ReferenceEstimate, tp: TaskPolicy, decides: bool) -> RuleResult:
    """Pass iff the lower limit of mean delta log-prob > -margin; fail iff its upper limit < -margin."""
    return _bound_rule("reference_logprob", ref.delta_logprob, -tp.reference_logprob_margin, True,
                       "mean delta log-prob of the reference", "reference less likely", decides, tp)


def kl_rule(ref: ReferenceEstimate, tp: TaskPolicy, decides: bool) -> RuleResult:
    """Pass iff the upper limit of the mean KL < margin; fail iff its lower limit > margin."""
    return _bound_rule("reference_kl", ref.kld, tp.reference_kl_margin, False, "mean KL on the reference",
                       "distributions diverge", decides, tp)


def _worst(statuses: list[Status]) -> Status:
    return "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"


def reference_decides(tp: TaskPolicy, no_information: bool) -> bool:
    """Whether the reference-answer rules decide (`reference_gate`: always, or where accuracy carries no
    information), rather than being reported beside the accuracy rules."""
    return (tp.reference_gate in ("always", "instead_of_accuracy")
            or (tp.reference_gate == "when_no_information" and no_information))


def with_reference(verdict: TaskVerdict, comparison: Comparison, tp: TaskPolicy) -> TaskVerdict:
    """`verdict` with the task's reference-answer rules added (reported), deciding as `reference_gate` says."""
    ref = next((r for r in comparison.reference if r.task == verdict.task), None)
    if ref is None:
        return verdict
    no_info = verdict.kind == "no_information"
    decides = reference_decides(tp, no_info)
    if ref.n == 0:
        note = f"reference-answer signal not available ({ref.unavailable or 'no log-probs'})"
        return verdict.model_copy(update={"warnings": [*verdict.warnings, note]})
    rules = [logprob_rule(ref, tp, decides), kl_rule(ref, tp, decides)]
    update: dict[str, object] = {"rules": [*verdict.rules, *rules]}
    if decides and verdict.kind != "errors":
        status = _worst([r.status for r in rules])
        first = next(r for r in rules if r.status == status)
        if tp.reference_gate == "instead_of_accuracy" and not (verdict.status == "fail" and verdict.kind == "decided"):
            update.update(status=status, kind="decided" if status != "inconclusive" else verdict.kind, p_worse=None,
                          reason=f"decided on the reference answers ({ref.n} items): {first.detail}; "
                                 f"accuracy (reported): {verdict.reason}")
        elif no_info:
            lead = verdict.reason.split(";")[0]
            update.update(status=status, kind="decided" if status != "inconclusive" else "no_information",
                          p_worse=None, reason=f"{lead}; decided on the reference answers ({ref.n} items): {first.detail}")
        else:
            combined = _worst([verdict.status, status])
            if combined != verdict.status:
                update.update(status=combined, kind="decided" if combined == "fail" else verdict.kind,
                              reason=f"reference answers ({ref.n} items): {first.detail}; accuracy: {verdict.reason}")
    return verdict.model_copy(update=update)
