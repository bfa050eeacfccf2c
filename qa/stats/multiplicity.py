"""Multiplicity adjustments (formulas only)."""

from __future__ import annotations

from collections.abc import Sequence


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order (statsmodels' `multipletests(method="holm")`
    without its gc.collect(), which costs seconds per call in a process holding a model)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    out = [0.0] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        out[i] = running
    return out


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (q-values), in the input's order: q_(i) = min_{j >= i} m p_(j) / j,
    at most 1 (statsmodels' `multipletests(method="fdr_bh")`, checked against it in the tests)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i], reverse=True)
    out = [0.0] * m
    running = 1.0
    for back, i in enumerate(order):
        running = min(running, m * p_values[i] / (m - back))
        out[i] = running
    return out
