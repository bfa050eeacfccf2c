"""The report's tables as plain-text cells (escaped by the renderer): one row per task, one per
generative task's truncation and output length, one per distribution statistic, and the KV-cache
summary of kv_inspect.json (one row per format)."""

from __future__ import annotations

import math

from qa.files.comparison import (
    ArmGeneration,
    Comparison,
    DistributionEstimate,
    Estimate,
    GenerationEstimate,
    Interval,
)
from qa.files.verdict import RuleResult, TaskVerdict, Verdict
from qa.report.document import Cell
from qa.textfmt import percent, pts
from quant.kv.inspect_report import InspectReport, LayerReport

HEADERS = (
    "task",
    "verdict",
    "n",
    "baseline → candidate",
    "delta ± SE (paired)",
    "90% / 95% CI (pts)",
    "non-inferiority",
    "k-SE rule",
    "flips down / up",
    "McNemar p",
    "MDE",
    "answer agreement",
    "truncated",
)
NUM_COLS = frozenset({2, 3, 4, 5, 10, 12})  # right-aligned columns of HEADERS
KIND_LABELS = {
    "decided": "",
    "errors": "too many errors",
    "no_information": "no information",
    "underpowered": "underpowered",
    "undefined": "undefined",
    "missing": "missing",
}
NOT_DECIDED = frozenset({"no_information", "errors", "missing", "undefined"})  # rules shown as n/a
DIST_HEADERS = (
    "task",
    "statistic",
    "value",
    "SE (by chunk)",
    "SE (naive)",
    "95% CI",
    "p99",
    "p99.9",
    "max",
    "tokens / chunks",
)
DIST_LABELS = {
    "kld": "mean KL(base || cand), nats/token",
    "top1_agree": "top-1 token agreement",
    "delta_p": "mean change in p(next token)",
    "log_ppl_ratio": "log perplexity ratio (cand / base)",
}
GEN_HEADERS = (
    "task",
    "truncated: baseline",
    "truncated: candidate",
    "change in truncation (pts)",
    "truncation rule",
    "output tokens: baseline → candidate",
    "change in output tokens, 95% CI",
)
KV_HEADERS = (
    "format",
    "layers",
    "K SQNR mean / min (dB)",
    "V SQNR mean / min (dB)",
    "underflow K / V",
    "saturation K / V",
    "attention rel. error mean / max",
)


def share(x: float | None) -> str:
    """A share in [0, 1] as '12.3%' ('-' when undefined)."""
    return "-" if x is None else f"{100 * x:.1f}%"


def ci_pts(ci: Interval | None) -> str:
    """An interval in score units as '[-1.2, +0.4]' points ('-' when undefined)."""
    return "-" if ci is None else f"[{100 * ci.lower:+.1f}, {100 * ci.upper:+.1f}]"


def p_text(p: float | None) -> str:
    """A p-value with three decimals, or in scientific notation below 0.001."""
    if p is None:
        return "-"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def rule(tv: TaskVerdict, name: str) -> RuleResult | None:
    """The task's result of one rule (None when the policy did not compute it)."""
    return next((r for r in tv.rules if r.rule == name), None)


def results_headers(verdict: Verdict) -> list[str]:
    """HEADERS with the k-SE column named for the policy's k when every task uses the same one."""
    ks = {r.k for t in verdict.tasks for r in t.rules if r.rule == "sigma" and r.k is not None}
    label = f"{ks.pop():g}-SE rule" if len(ks) == 1 else "k-SE rule"
    return [label if h == "k-SE rule" else h for h in HEADERS]


def _rule_cells(tv: TaskVerdict) -> tuple[Cell, Cell]:
    if tv.kind in NOT_DECIDED:
        skipped = Cell("n/a", KIND_LABELS[tv.kind])
        return skipped, skipped
    ni, sig = rule(tv, "noninferiority"), rule(tv, "sigma")
    ni_cell = Cell("-") if ni is None else Cell(ni.status, f"margin {100 * (ni.margin or 0):.1f} pts")
    if sig is None:
        return ni_cell, Cell("-")
    thr = "-" if sig.threshold is None else f"{100 * sig.threshold:.1f}"
    rel = "≤" if sig.status == "pass" else ">"
    return ni_cell, Cell(
        sig.status, f"|d| {rel} {thr} pts ({sig.basis} SE); false alarm {percent(sig.false_alarm_rate)}"
    )


def _mcnemar_cell(est: Estimate) -> Cell:
    if est.mcnemar is None:
        return Cell("-")
    mc = est.mcnemar
    how = "sign test on items; " if mc.method == "sign_test_items" else ""
    return Cell(p_text(mc.p_exact), f"{how}mid-p {p_text(mc.p_midp)}")


def truncation_cell(tv: TaskVerdict, gen: GenerationEstimate | None) -> Cell:
    """Truncation rates baseline → candidate, and below them the paired change with the gate's CI and
    the truncation rule's status ('-' when the task's records do not say)."""
    b, c = (gen.baseline, gen.candidate) if gen is not None else (None, None)
    if b is None or c is None or b.truncation_rate is None:
        return Cell("-", "not recorded" if gen is not None else "")
    main = f"{share(b.truncation_rate)} → {share(c.truncation_rate)}"
    tr = rule(tv, "truncation")
    if tr is None or gen is None or gen.truncation is None:
        return Cell(main)
    ci = f", {round(100 * tr.ci_level)}% CI {ci_pts(tr.ci)}" if tr.ci is not None and tr.ci_level else ""
    role = "" if tr.decides else " (reported)"
    return Cell(main, f"{pts(gen.truncation.delta)}{ci}; {tr.status}{role}")


def table_row(tv: TaskVerdict, est: Estimate | None, gen: GenerationEstimate | None = None) -> list[Cell]:
    """The cells of one task's row (HEADERS order); `gen` is the task's truncation estimate."""
    head = [Cell(tv.task, tv.metric), Cell(tv.status.upper(), KIND_LABELS[tv.kind])]
    if est is None:
        return head + [Cell("-")] * (len(HEADERS) - 2)
    ni_cell, sig_cell = _rule_cells(tv)
    flips = Cell("-")
    if est.flips is not None:
        f = est.flips
        flips = Cell(
            f"{f.n10} / {f.n01}", f"{100 * f.rate:.1f}% [{100 * f.ci95.lower:.1f}, {100 * f.ci95.upper:.1f}]"
        )
    mde = Cell("-")
    if tv.mde is not None and tv.kind not in NOT_DECIDED:
        need = f"need n ≥ {tv.n_needed}" if tv.n_needed and tv.n_needed > tv.n else ""
        mde = Cell(f"{100 * tv.mde:.1f} pts", need)
    agree = Cell("-")
    if est.agreement is not None:
        shares = [est.agreement.extracted, est.agreement.completion]
        main = " / ".join("-" if s is None else f"{100 * s.share:.1f}%" for s in shares)
        agree = Cell(main, "answers / completions identical")
    se = "-" if est.se_paired is None else f"{100 * est.se_paired:.1f}"
    return head + [
        Cell(f"{est.n}", f"x{est.repeats} repeats" if est.repeats > 1 else ""),
        Cell(f"{share(est.mean_baseline)} → {share(est.mean_candidate)}"),
        Cell(f"{pts(est.delta)} ± {se}"),
        Cell(ci_pts(est.ci90), ci_pts(est.ci95)),
        ni_cell,
        sig_cell,
        flips,
        _mcnemar_cell(est),
        mde,
        agree,
        truncation_cell(tv, gen),
    ]


def _arm_truncation(a: ArmGeneration) -> Cell:
    if a.truncation_rate is None or a.truncation_ci95 is None:
        return Cell("not recorded")
    ci = a.truncation_ci95
    return Cell(f"{a.truncated} / {a.n_samples} = {share(a.truncation_rate)}",
                f"95% [{100 * ci.lower:.1f}, {100 * ci.upper:.1f}]")


def generation_row(gen: GenerationEstimate, tv: TaskVerdict | None) -> list[Cell]:
    """One generative task's truncation and output-length row (GEN_HEADERS order)."""
    tr = rule(tv, "truncation") if tv is not None else None
    change, verdict = Cell("-"), Cell("-", "not recorded" if gen.truncation is None else "")
    if gen.truncation is not None:
        t = gen.truncation
        change = Cell(pts(t.delta), f"90% {ci_pts(t.ci90)}; 95% {ci_pts(t.ci95)}")
    if tr is not None:
        verdict = Cell(tr.status + ("" if tr.decides else " (reported)"), tr.detail)
    tokens, tokens_change = Cell("-", "not recorded"), Cell("-")
    b, c = gen.baseline.mean_output_tokens, gen.candidate.mean_output_tokens
    if b is not None and c is not None:
        tokens = Cell(f"{b:.1f} → {c:.1f}", f"mean per sample, {gen.candidate.n_output_tokens} samples")
    o = gen.output_tokens
    if o is not None and o.delta is not None:
        ci = "-" if o.ci95 is None else f"[{o.ci95.lower:+.1f}, {o.ci95.upper:+.1f}]"
        tokens_change = Cell(f"{o.delta:+.1f}", ci)
    return [Cell(gen.task), _arm_truncation(gen.baseline), _arm_truncation(gen.candidate), change, verdict,
            tokens, tokens_change]


def generation_rows(comparison: Comparison, verdict: Verdict) -> list[list[Cell]]:
    """One GEN_HEADERS row per generative task of the comparison that records truncation or length."""
    by_task = {t.task: t for t in verdict.tasks}
    return [generation_row(g, by_task.get(g.task)) for g in comparison.generation]


def family_false_alarm(verdict: Verdict) -> float | None:
    """P(at least one task fails the k-SE rule) for identical candidates: 1 - prod(1 - FA_task)."""
    rates = [
        r.false_alarm_rate
        for t in verdict.tasks
        for r in t.rules
        if r.rule == "sigma" and r.false_alarm_rate is not None
    ]
    if not rates:
        return None
    return 1 - math.prod(1 - r for r in rates)


def dist_row(d: DistributionEstimate) -> list[str]:
    """One distribution statistic's row (DIST_HEADERS order)."""

    def g(x: float | None) -> str:
        return "-" if x is None else f"{x:.4g}"

    ci = "-" if d.ci95 is None else f"[{d.ci95.lower:.4g}, {d.ci95.upper:.4g}]"
    return [
        d.task,
        DIST_LABELS[d.metric],
        g(d.value),
        g(d.se),
        g(d.se_naive),
        ci,
        g(d.p99),
        g(d.p999),
        g(d.max),
        f"{d.n_tokens} / {d.n_chunks}",
    ]


# ----------------------------------------------------------------------------- KV cache


def db(x: float) -> str:
    """SQNR in dB with one decimal; an exact reconstruction (inf) is 'exact'."""
    if math.isinf(x):
        return "exact" if x > 0 else "-inf"
    return f"{x:.1f}"


def layer_ranges(layers: list[int]) -> str:
    """Layer indices as compact ranges: [0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    out: list[str] = []
    for i in sorted(layers):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


def _sqnr_cell(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    mean = db(sum(finite) / len(finite)) if finite else db(min(values))
    return f"{mean} / {db(min(values))}"


def _shares(values: list[float]) -> str:
    return "0" if not any(values) else percent(sum(values) / len(values))


def kv_rows(report: InspectReport) -> list[list[str]]:
    """One row per KV format of kv_inspect.json (KV_HEADERS order): SQNR mean (over layers, exact layers
    left out) / min, mean underflow and saturation shares of 16-element blocks, attention error."""
    groups: dict[str, list[LayerReport]] = {}
    for layer in report.layers:
        groups.setdefault(layer.format, []).append(layer)
    rows = []
    for fmt, ls in groups.items():
        attn = [r.attn_rel_error for r in ls]
        rows.append([
            fmt,
            layer_ranges([r.layer for r in ls]),
            _sqnr_cell([r.k.sqnr_db for r in ls]),
            _sqnr_cell([r.v.sqnr_db for r in ls]),
            f"{_shares([r.k.underflow_share for r in ls])} / {_shares([r.v.underflow_share for r in ls])}",
            f"{_shares([r.k.saturation_share for r in ls])} / {_shares([r.v.saturation_share for r in ls])}",
            f"{sum(attn) / len(attn):.3g} / {max(attn):.3g}",
        ])
    return rows


def kv_memory(report: InspectReport) -> str | None:
    """One line: the candidate's KV-cache bytes per token against the 16-bit cache's (None without the geometry)."""
    return memory_line(report.bytes_per_token(), [layer.format for layer in report.layers])


def memory_line(sizes: tuple[int, int] | None, formats: list[str]) -> str | None:
    """'KV-cache memory: N bytes per token over L layers, P% of the 16-bit cache's M (...)' for `sizes`
    (quantized, 16-bit) over layers of `formats` (None when the sizes are not known)."""
    if sizes is None:
        return None
    quantized, plain = sizes
    kept = formats.count("none")
    how = f"; {kept} of {len(formats)} layers kept unquantized" if kept and len(set(formats)) > 1 else ""
    return (f"KV-cache memory: {quantized} bytes per token over {len(formats)} layers, "
            f"{100 * quantized / plain:.1f}% of the 16-bit cache's {plain} (data, scales and any norms or "
            f"padding, by the formats' definitions{how})")


def kv_caption(report: InspectReport) -> str:
    """One line naming what kv_inspect.json measured."""
    spec = report.spec
    window = f", last {spec.recent_window} positions in {spec.recent_format}" if spec.recent_window else ""
    return (
        f"{report.model or 'candidate model'}: {spec.format} KV cache{window}, scales {report.scales}; "
        f"{report.n_prompts} prompts x {report.tokens_per_prompt} tokens, each layer's K and V written to a "
        "fresh emulated cache and compared with the plain model's (SQNR = 10 log10(|x|^2 / |x^ - x|^2), "
        "higher = smaller error); attention error per layer on that layer's own inputs"
    )
