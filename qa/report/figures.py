"""The report's figures, drawn from ReportInputs with `qa.report.plots`: forest plot, flips, KL per chunk,
per-layer KV-cache error."""

from __future__ import annotations

from dataclasses import dataclass

from qa.report import plots
from qa.report.gather import ReportInputs, gated_estimate
from qa.report.rows import rule


@dataclass(frozen=True)
class Figures:
    """PNG bytes of every figure the report has data for."""

    forest: bytes | None
    flips: bytes | None
    kl: list[tuple[str, bytes]]  # (task, histogram of its per-chunk KL)
    kv: bytes | None

    def files(self) -> dict[str, bytes]:
        """The figures written as plots/<name>.png beside report.md (forest, flips, kv; those drawn)."""
        drawn = (("forest", self.forest), ("flips", self.flips), ("kv", self.kv))
        return {name: png for name, png in drawn if png is not None}


def forest_rows(inp: ReportInputs) -> list[plots.ForestRow]:
    """One forest-plot row per gated task with a delta: the gate's interval (its non-inferiority rule's,
    at 1 - 2 alpha) and the stored 95% interval."""
    rows = []
    for tv in inp.verdict.tasks:
        est = gated_estimate(inp.comparison, tv)
        if est is None or est.delta is None:
            continue
        ni = rule(tv, "noninferiority")
        gate_ci = ni.ci if ni is not None else None
        level = ni.ci_level if ni is not None and ni.ci_level is not None else 1 - 2 * tv.alpha
        rows.append(plots.ForestRow(
            tv.task,
            est.delta,
            (gate_ci.lower, gate_ci.upper) if gate_ci else None,
            (est.ci95.lower, est.ci95.upper) if est.ci95 else None,
            tv.margin,
            tv.status,
            gate_level=level,
        ))
    return rows


def make_figures(inp: ReportInputs) -> Figures:
    """Draw the figures; a figure without data is None (or an empty list)."""
    forest = forest_rows(inp)
    flip_rows = []
    for tv in inp.verdict.tasks:
        est = gated_estimate(inp.comparison, tv)
        if est is not None and est.delta is not None and est.flips is not None:
            flip_rows.append(plots.FlipRow(tv.task, est.flips.n10, est.flips.n01))
    kl = [
        (d.task, plots.kl_plot(f"{d.task}: KL per chunk", [c.value for c in d.per_chunk], d.value))
        for d in inp.comparison.distribution
        if d.metric == "kld" and d.per_chunk
    ]
    return Figures(
        forest=plots.forest_plot(forest) if forest else None,
        flips=plots.flips_plot(flip_rows) if flip_rows else None,
        kl=kl,
        kv=plots.kv_error_plot(plots.kv_layer_rows(inp.kv)) if inp.kv is not None and inp.kv.layers else None,
    )
