"""comparison.json `slices`: per-slice tables of a task whose records say where each item sits (turn depth,
context length, kind of turn or subtask), written by `qa.compare.slices`, shown by `qa.report.slices`.

One row per (slice value, arm): the candidate against the baseline, and the baseline rerun against the
baseline (the A/A control at the same slice) when the run has one. Sign: delta = arm - baseline.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from qa.files.estimates import Frozen, Interval

SliceDimension = Literal["turn", "length", "kind"]


class SliceRow(Frozen):
    """One slice value of one arm against the baseline, on the paired units of that slice (a unit: one item;
    a session task's turn on its primary path). Shares are of units; None: undefined or not recorded."""

    value: str  # "1", "3-4" (turn depth), "2K-4K" or "L4096" (context length), "tool" (kind)
    order: int  # sort key of the values of a dimension
    arm: str
    role: Literal["candidate", "rerun"]
    n: int  # units scored in both arms
    n_clusters: int
    mean_baseline: float | None = None
    mean_arm: float | None = None
    delta: float | None = None  # arm - baseline, mean of the per-unit differences
    se: float | None = None  # CR1 over the units' clusters (G - 1 df)
    ci95: Interval | None = None
    tool_n: int = 0  # tool-call units among them
    valid_baseline: float | None = None  # share of tool-call units whose output decodes as calls
    valid_arm: float | None = None
    identical: float | None = None  # share of units with the same completion in both arms
    first_divergence_chars: float | None = None  # median character offset of the first difference (units that differ)
    first_divergence_tokens: float | None = None  # the same in tokens, estimated (offset x the baseline's tokens/char)
    top1_diverged: float | None = None  # share of units whose fixed continuation's top-1 token differs somewhere
    top1_first_position: float | None = None  # median token position of that first top-1 difference
    kld: float | None = None  # mean per unit of KL(baseline || arm) per token on the fixed continuation, nats
    kld_ci95: Interval | None = None  # CR1 over clusters
    warm_hit_rate: float | None = None  # the arm's warm path: cached / prompt tokens (session tasks)
    warm_identical: float | None = None  # the arm's warm completion equals its cold one


class SliceTable(Frozen):
    """One task, one dimension, one "metric,filter": its rows, values in order, the candidate before the rerun."""

    task: str
    dimension: SliceDimension
    metric: str
    path: str | None = None  # the serving path the units come from (session tasks), None otherwise
    rows: list[SliceRow] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
