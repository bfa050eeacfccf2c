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


def test_forest_plot_with_a_reference_panel() -> None:
    rows = [plots.ForestRow("gsm8k", 0.0, (-0.145, 0.145), (-0.19, 0.19), 0.02, "inconclusive")]
    ref = [plots.ReferenceRow("gsm8k: delta log-prob", -0.065, (-0.098, -0.032), (-0.105, -0.025), -0.15, "pass"),
           plots.ReferenceRow("gsm8k: KL", 0.084, (0.067, 0.1), (0.063, 0.104), 0.15, "pass")]
    with_ref, alone = plots.forest_plot(rows, ref), plots.forest_plot(rows)
    assert with_ref[:8] == alone[:8] == PNG_MAGIC and with_ref != alone
    assert plots.forest_plot([], ref)[:8] == PNG_MAGIC  # reference rows only
