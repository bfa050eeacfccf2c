"""The report's figures, drawn from ReportInputs with `qa.report.plots`: the forest plot (accuracy, and the
reference-answer intervals of every task they decide), flips, KL per chunk, per-layer KV-cache error."""

from __future__ import annotations

from dataclasses import dataclass

from qa.files.comparison import ReferenceEstimate, ReferenceStat
from qa.files.verdict import TaskVerdict
from qa.report import plots
from qa.report.document import Figure
from qa.report.gather import ReportInputs, gated_estimate
from qa.report.rows import rule

KV_TITLE = "Per-layer KV-cache error"
# reference rule -> (its label in the plot, the sign of its bound: -margin for delta log-prob, +margin for KL)
REFERENCE_RULES = {
    "reference_logprob": ("delta log-prob", -1.0),
    "reference_kl": ("KL", 1.0),
}


@dataclass(frozen=True)
class Figures:
    """Every figure the report has data for (None, or no KL figure, where it has none)."""

    forest: Figure | None
    flips: Figure | None
    kl: tuple[Figure, ...]  # one histogram of per-chunk KL per task
    kv: Figure | None

    def files(self) -> dict[str, bytes]:
        """The figures written as plots/<name>.png beside report.md, by name."""
        drawn = [self.forest, self.flips, self.kv, *self.kl]
        return {f.name: f.png for f in drawn if f is not None}


def _reference_stat(ref: ReferenceEstimate, rule_name: str) -> ReferenceStat | None:
    return ref.delta_logprob if rule_name == "reference_logprob" else ref.kld


def decided_on_reference(tv: TaskVerdict) -> bool:
    """True when the task's reference-answer rules decide it (the policy's `reference_gate`)."""
    return any(r.decides and r.rule in REFERENCE_RULES for r in tv.rules)


def forest_rows(inp: ReportInputs) -> list[plots.ForestRow]:
    """One forest-plot row per gated task with a delta: the gate's interval (its non-inferiority rule's,
    at 1 - 2 alpha) and the stored 95% interval; coloured by the task's status, or, for a task decided on its
    reference answers, by the accuracy rule's own status (its reference rows show what decided it)."""
    out = []
    for tv in inp.verdict.tasks:
        est = gated_estimate(inp.comparison, tv)
        if est is None or est.delta is None:
            continue
        ni = rule(tv, "noninferiority")
        gate_ci = ni.ci if ni is not None else None
        level = ni.ci_level if ni is not None and ni.ci_level is not None else 1 - 2 * tv.alpha
        status = ni.status if ni is not None and decided_on_reference(tv) else tv.status
        out.append(plots.ForestRow(
            tv.task,
            est.delta,
            (gate_ci.lower, gate_ci.upper) if gate_ci else None,
            (est.ci95.lower, est.ci95.upper) if est.ci95 else None,
            tv.margin,
            status,
            gate_level=level,
        ))
    return out


def reference_rows(inp: ReportInputs) -> list[plots.ReferenceRow]:
    """One row per deciding reference-answer rule of each task, in nats/token: the rule's interval (1 - 2
    alpha), the stored 95% interval and the rule's bound (-margin for delta log-prob, +margin for KL)."""
    refs = {r.task: r for r in inp.comparison.reference}
    out = []
    for tv in inp.verdict.tasks:
        ref = refs.get(tv.task)
        for r in tv.rules if ref is not None else []:
            if not (r.decides and r.rule in REFERENCE_RULES) or r.margin is None:
                continue
            stat = _reference_stat(ref, r.rule)
            if stat is None:
                continue
            label, sign = REFERENCE_RULES[r.rule]
            out.append(plots.ReferenceRow(
                f"{tv.task}: {label}",
                stat.value,
                (r.ci.lower, r.ci.upper) if r.ci is not None else None,
                (stat.ci95.lower, stat.ci95.upper) if stat.ci95 is not None else None,
                sign * r.margin,
                r.status,
                gate_level=r.ci_level if r.ci_level is not None else 1 - 2 * tv.alpha,
            ))
    return out


def make_figures(inp: ReportInputs) -> Figures:
    """Draw the figures; a figure without data is None (or no KL figure)."""
    forest, ref = forest_rows(inp), reference_rows(inp)
    flip_rows = []
    for tv in inp.verdict.tasks:
        est = gated_estimate(inp.comparison, tv)
        if est is not None and est.delta is not None and est.flips is not None:
            flip_rows.append(plots.FlipRow(tv.task, est.flips.n10, est.flips.n01))
    kld = [d for d in inp.comparison.distribution if d.metric == "kld" and d.per_chunk]
    kl = tuple(
        Figure(f"kl-{i + 1}", f"KL divergence per chunk, {d.task}", f"KL divergence per chunk, {d.task}",
               plots.kl_plot(f"{d.task}: KL per chunk", [c.value for c in d.per_chunk], d.value))
        for i, d in enumerate(kld)
    )
    kv = None
    if inp.kv is not None and inp.kv.layers:
        kv = Figure("kv", KV_TITLE, "per-layer SQNR of K and V and attention error",
                    plots.kv_error_plot(plots.kv_layer_rows(inp.kv)))
    return Figures(
        forest=Figure("forest", "Forest plot of delta",
                      "forest plot of delta with the gate's and 95% CIs, and the reference-answer intervals "
                      "that decided a task", plots.forest_plot(forest, ref)) if forest or ref else None,
        flips=Figure("flips", "Flips", "regressions and improvements per task",
                     plots.flips_plot(flip_rows)) if flip_rows else None,
        kl=kl,
        kv=kv,
    )
