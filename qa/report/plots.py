"""Report figures as PNG bytes: forest plot of delta (with the reference-answer intervals that decided a task),
flip counts, KL divergence, per-layer KV error.

Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot, no global state, no
display needed). Labels come from task names and data files: they are passed with `$` escaped, so
a name can never switch on mathtext.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quant.fileio import atomic_write_bytes
from quant.kv.inspect_report import InspectReport

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

STATUS_COLOURS = {"pass": "#1a7f37", "fail": "#cf222e", "inconclusive": "#bf8700"}
GREY = "#57606a"
SQNR_HEADROOM_DB = 6.0  # an exact layer's bar ends this far above the best finite SQNR


@dataclass(frozen=True)
class ForestRow:
    """One task in the forest plot; all numbers in score units (0.01 = 1 accuracy point)."""

    label: str
    delta: float
    ci_gate: tuple[float, float] | None  # the interval the gate decided on, at `gate_level`
    ci95: tuple[float, float] | None
    margin: float
    status: str
    gate_level: float = 0.90  # two-sided level of ci_gate: 1 - 2 alpha


@dataclass(frozen=True)
class ReferenceRow:
    """One deciding reference-answer rule of a task, in nats per token; `bound` is where the rule's interval
    must lie beyond: -margin for delta log-prob (pass above it), +margin for KL (pass below it)."""

    label: str
    value: float
    ci_gate: tuple[float, float] | None  # the interval the rule decided on, at `gate_level`
    ci95: tuple[float, float] | None
    bound: float
    status: str
    gate_level: float = 0.90


@dataclass(frozen=True)
class KVLayerRow:
    """One layer of a kv_inspect.json report: SQNR in dB (inf = exact) and the attention relative error."""

    layer: int
    k_sqnr_db: float
    v_sqnr_db: float
    attn_rel_error: float


@dataclass(frozen=True)
class FlipRow:
    """Discordant pairs of one task: n10 regressions (baseline right only), n01 improvements."""

    label: str
    n10: int
    n01: int


def _label(text: str) -> str:
    return text.replace("$", r"\$")


def _figure(width: float, height: float) -> Figure:
    """A new figure on the Agg canvas (matplotlib is imported only when a figure is drawn)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib: only when a figure is drawn
    from matplotlib.figure import Figure  # matplotlib: only when a figure is drawn

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def _interval_row(ax: Axes, y: float, value: float, ci_gate: tuple[float, float] | None,
                  ci95: tuple[float, float] | None, colour: str, scale: float) -> None:
    """One row: thin 95% interval, thick gate interval, the estimate as a diamond (x values times `scale`)."""
    if ci95 is not None:
        ax.plot([scale * ci95[0], scale * ci95[1]], [y, y], color=colour, lw=1.4, solid_capstyle="butt")
    if ci_gate is not None:
        ax.plot([scale * ci_gate[0], scale * ci_gate[1]], [y, y], color=colour, lw=5.5, alpha=0.85,
                solid_capstyle="butt")
    ax.plot([scale * value], [y], marker="D", color="white", markeredgecolor=colour, markersize=7, zorder=3)


def _thick_label(levels: set[int]) -> str:
    return f"{levels.pop()}% CI (the gate's)" if len(levels) == 1 else "the gate's (1 - 2 alpha) CI"


def _tidy(ax: Axes, labels: list[str]) -> None:
    ys = list(range(len(labels)))[::-1]
    ax.set_yticks(ys, [_label(x) for x in labels])
    ax.set_ylim(-0.7, len(labels) - 0.3)
    ax.axvline(0, color=GREY, lw=1)
    ax.grid(axis="x", color="#d0d7de", lw=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _accuracy_panel(ax: Axes, rows: list[ForestRow]) -> None:
    ys = list(range(len(rows)))[::-1]
    margins = {r.margin for r in rows}
    for y, r in zip(ys, rows, strict=True):
        colour = STATUS_COLOURS.get(r.status, GREY)
        _interval_row(ax, y, r.delta, r.ci_gate, r.ci95, colour, 100)
        if len(margins) > 1:
            ax.plot([-100 * r.margin] * 2, [y - 0.35, y + 0.35], color=STATUS_COLOURS["fail"], lw=1.5, ls="--")
    _tidy(ax, [r.label for r in rows])
    if len(margins) == 1:
        m = margins.pop()
        ax.axvline(-100 * m, color=STATUS_COLOURS["fail"], lw=1.5, ls="--", label=f"-margin ({100 * m:.1f} pts)")
        ax.legend(loc="lower right", fontsize=8, frameon=False)
    thick = _thick_label({round(100 * r.gate_level) for r in rows})
    ax.set_xlabel(f"delta = candidate - baseline (accuracy points); thick: {thick}, thin: 95% CI")


def _reference_panel(ax: Axes, rows: list[ReferenceRow]) -> None:
    ys = list(range(len(rows)))[::-1]
    for y, r in zip(ys, rows, strict=True):
        _interval_row(ax, y, r.value, r.ci_gate, r.ci95, STATUS_COLOURS.get(r.status, GREY), 1)
        ax.plot([r.bound] * 2, [y - 0.35, y + 0.35], color=STATUS_COLOURS["fail"], lw=1.5, ls="--")
    _tidy(ax, [r.label for r in rows])
    thick = _thick_label({round(100 * r.gate_level) for r in rows})
    ax.set_xlabel(f"nats/token on the reference answers; thick: {thick}, thin: 95% CI; dashed: the rule's bound")
    ax.set_title("What decided these tasks: their reference answers (delta log-prob = candidate - baseline: "
                 "pass above its bound; KL: pass below it)", fontsize=8, loc="left")


def forest_plot(rows: list[ForestRow], reference: list[ReferenceRow] | None = None) -> bytes:
    """Delta per task in points: thick bar = the gate's (1 - 2 alpha) CI, thin = 95%; lines at 0 and -margin.
    With `reference` rows, a second panel below in nats/token: each deciding reference-answer rule's interval
    against its bound (-margin for delta log-prob, +margin for KL)."""
    reference = reference or []
    panels = [n for n in (len(rows), len(reference)) if n]
    fig = _figure(8.0, 1.1 * len(panels) + 0.55 * sum(panels))
    axes = fig.subplots(len(panels), 1, height_ratios=[n + 1 for n in panels], squeeze=False)[:, 0]
    if rows:
        _accuracy_panel(axes[0], rows)
    if rows and reference:
        fig.subplots_adjust(hspace=0.55)
    if reference:
        _reference_panel(axes[-1], reference)
    return _png(fig)


def flips_plot(rows: list[FlipRow]) -> bytes:
    """Diverging bars per task: regressions (n10) to the left, improvements (n01) to the right."""
    fig = _figure(8.0, 1.1 + 0.5 * len(rows))
    ax = fig.add_subplot()
    ys = list(range(len(rows)))[::-1]
    ax.barh(
        ys,
        [-r.n10 for r in rows],
        color=STATUS_COLOURS["fail"],
        label="regressions (baseline right, candidate wrong)",
    )
    ax.barh(
        ys,
        [r.n01 for r in rows],
        color=STATUS_COLOURS["pass"],
        label="improvements (candidate right, baseline wrong)",
    )
    top = max([max(r.n10, r.n01) for r in rows] + [1])
    for y, r in zip(ys, rows, strict=True):
        ax.text(-r.n10 - 0.02 * top, y, str(r.n10), ha="right", va="center", fontsize=8)
        ax.text(r.n01 + 0.02 * top, y, str(r.n01), ha="left", va="center", fontsize=8)
    ax.set_xlim(-1.25 * top, 1.25 * top)
    ax.axvline(0, color=GREY, lw=1)
    ax.set_yticks(ys, [_label(r.label) for r in rows])
    ax.set_xlabel("discordant (item, repeat) pairs")
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25 if len(rows) > 2 else -0.45),
        ncol=2,
        fontsize=8,
        frameon=False,
    )
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return _png(fig)


def kl_plot(label: str, per_chunk: list[float], mean: float) -> bytes:
    """Histogram of per-chunk mean KL(base || cand) in nats, with the overall mean per token."""
    fig = _figure(8.0, 3.0)
    ax = fig.add_subplot()
    ax.hist(per_chunk, bins=min(40, max(5, len(per_chunk) // 2)), color="#0969da", alpha=0.8)
    ax.axvline(mean, color="black", lw=1.5, label=f"mean per token {mean:.4g}")
    ax.set_xlabel("per-chunk mean KL(baseline || candidate), nats per token")
    ax.set_ylabel("chunks")
    ax.set_title(_label(label), fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return _png(fig)


def kv_error_plot(rows: list[KVLayerRow]) -> bytes:
    """Per layer: grouped bars of K and V SQNR (dB, higher = smaller error; exact layers drawn hatched
    at the top of the axis) above bars of the attention output's relative error."""
    fig = _figure(max(6.0, 0.32 * len(rows) + 2), 5.2)
    ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    xs = list(range(len(rows)))
    finite = [v for r in rows for v in (r.k_sqnr_db, r.v_sqnr_db) if math.isfinite(v)]
    top = max(finite + [0.0]) + SQNR_HEADROOM_DB  # where an exact (inf dB) layer's bar ends
    bottom = min(finite + [0.0]) - SQNR_HEADROOM_DB  # and where a -inf dB (all error) layer's bar ends
    w = 0.4
    for offset, values, colour, name in (
        (-w / 2, [r.k_sqnr_db for r in rows], "#0969da", "K"),
        (w / 2, [r.v_sqnr_db for r in rows], "#8250df", "V"),
    ):
        heights = [top if v == math.inf else bottom if v == -math.inf else v for v in values]
        bars = ax.bar([x + offset for x in xs], heights, w, color=colour, label=name)
        for bar, v in zip(bars, values, strict=True):
            if math.isinf(v):
                bar.set_hatch("//")
                bar.set_alpha(0.35)
    if any(math.isinf(v) for r in rows for v in (r.k_sqnr_db, r.v_sqnr_db)):
        ax.text(1.0, 1.0, "hatched: exact (inf dB) or all error (-inf dB)", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=7, color=GREY)
    ax.set_ylabel("SQNR (dB)")
    ax.legend(fontsize=8, frameon=False, ncol=2, loc="lower left", bbox_to_anchor=(0.0, 1.0))
    ax2.bar(xs, [r.attn_rel_error for r in rows], 0.6, color=GREY)
    ax2.set_ylabel("attention rel. error")
    ax2.set_xticks(xs, [str(r.layer) for r in rows], fontsize=7, rotation=90 if len(rows) > 24 else 0)
    ax2.set_xlabel("layer")
    for a in (ax, ax2):
        for side in ("top", "right"):
            a.spines[side].set_visible(False)
    return _png(fig)


def kv_layer_rows(report: InspectReport) -> list[KVLayerRow]:
    """kv_inspect.json's layers as rows of `kv_error_plot`."""
    return [KVLayerRow(r.layer, r.k.sqnr_db, r.v.sqnr_db, r.attn_rel_error) for r in report.layers]


def write_kv_plot(report: InspectReport, path: Path) -> Path:
    """`kv_error_plot` of a KV inspection as a PNG file (atomically); returns the path."""
    atomic_write_bytes(path, kv_error_plot(kv_layer_rows(report)))
    return path
