"""qa.report.plots: every figure is a PNG, and a label can never switch on mathtext."""

from __future__ import annotations

import math

from qa.report import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plots_are_png_and_labels_cannot_trigger_mathtext() -> None:
    rows = [plots.ForestRow("$\\alpha$ task", -0.01, (-0.02, 0.0), (-0.025, 0.005), 0.02, "pass")]
    assert plots.forest_plot(rows)[:8] == PNG_MAGIC
    assert plots.flips_plot([plots.FlipRow("a$b$", 3, 1)])[:8] == PNG_MAGIC
    assert plots.kl_plot("kl $x$", [0.01, 0.02, 0.03], 0.02)[:8] == PNG_MAGIC


def test_kv_plot_draws_exact_and_negative_layers() -> None:
    rows = [
        plots.KVLayerRow(0, 20.0, 18.0, 0.1),
        plots.KVLayerRow(1, math.inf, math.inf, 0.0),  # a skipped layer: exact
        plots.KVLayerRow(2, -3.0, -math.inf, 1.2),  # a broken layer: more error than signal
    ]
    assert plots.kv_error_plot(rows)[:8] == PNG_MAGIC


def test_forest_plot_with_two_gate_levels() -> None:
    rows = [
        plots.ForestRow("a", -0.01, (-0.02, 0.0), None, 0.02, "pass", gate_level=0.9),
        plots.ForestRow("b", -0.03, None, (-0.05, -0.01), 0.01, "fail", gate_level=0.95),
    ]
    assert plots.forest_plot(rows)[:8] == PNG_MAGIC
