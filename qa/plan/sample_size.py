"""Sample-size plans (`qa plan`): items and repeats a paired non-inferiority test needs to detect a drop of `margin`.

Model (Miller 2024, "Adding Error Bars to Evals", sections 4-5): per-sample differences
d = b - a of a binary score with accuracy p in both arms and paired correlation rho have
Var(d) = 2 p (1 - p) (1 - rho). A share `within_share` of it is sampling noise within an item
(0 for greedy decoding), which K repeats divide by K:
Var(dbar_i) = Var(d) (1 - W + W / K). Items needed: n = ceil(((z_{1-alpha} + z_power) sd / margin)^2).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field
from scipy import stats

from qa.files.comparison import Estimate
from qa.stats.power import items_needed, repeats_needed


class PlanRow(BaseModel):
    """Items needed at one repeat count."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    repeats: int
    items_needed: int


class SampleSizePlan(BaseModel):
    """Sample-size plan for one task (accuracy units; delta = candidate - baseline)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: str
    margin: float
    alpha: float
    power: float
    accuracy: float
    rho: float
    within_share: float
    sd_diff: float  # per-sample sd of the paired difference
    source: str  # "assumed" or the comparison it was read from
    rows: list[PlanRow]
    n_items: int | None = None  # items the task has (when known)
    mde_at_n: float | None = None  # single repeat
    repeats_needed_at_n: int | None = None  # None: repeats alone cannot reach the margin
    sigma_rule_false_alarm: float | None = None  # baseline basis, k = 1.5, identical candidate
    sigma_rule_drop_caught_80: float | None = None
    notes: list[str] = Field(default_factory=list)


def sample_size_plan(
    task: str,
    margin: float,
    *,
    accuracy: float = 0.5,
    rho: float = 0.5,
    alpha: float = 0.05,
    power: float = 0.8,
    within_share: float = 0.0,
    n_items: int | None = None,
    k: float = 1.5,
) -> SampleSizePlan:
    """Items (per repeat count) and repeats needed for MDE <= margin under the module's model."""
    sd = math.sqrt(2 * accuracy * (1 - accuracy) * (1 - rho))
    return _plan(task, margin, accuracy, rho, alpha, power, within_share, n_items, k, sd, "assumed")


def sample_size_from_estimate(est: Estimate, margin: float, *, alpha: float = 0.05, power: float = 0.8,
                              n_items: int | None = None, k: float = 1.5) -> SampleSizePlan:
    """A plan from a pilot comparison's estimate: its sd of differences, rho and accuracy."""
    sd = est.sd_diff if est.sd_diff is not None else 0.0  # sd of item-mean differences at the pilot's repeats
    out = _plan(est.task, margin, est.mean_baseline or 0.0, est.rho if est.rho is not None else 0.0, alpha,
                power, 0.0, n_items if n_items is not None else est.n, k, sd,
                f"estimate {est.task}/{est.metric},{est.filter}")
    if est.repeats > 1:
        note = f"sd of differences measured at {est.repeats} repeats per item; row 'repeats' counts on top of that"
        out = out.model_copy(update={"notes": [*out.notes, note]})
    return out


def _plan(task: str, margin: float, accuracy: float, rho: float, alpha: float, power: float,
          within_share: float, n_items: int | None, k: float, sd: float, source: str) -> SampleSizePlan:
    z_a, z_b = float(stats.norm.ppf(1 - alpha)), float(stats.norm.ppf(power))
    rows = []
    for reps in (1, 2, 4, 8, 16) if within_share > 0 else (1,):
        sd_k = sd * math.sqrt(1 - within_share + within_share / reps)
        needed = items_needed(sd_k, margin, alpha, power)  # never None at delta = 0
        assert needed is not None
        rows.append(PlanRow(repeats=reps, items_needed=needed))
    notes = []
    if within_share == 0:
        notes.append("within_share = 0 (greedy decoding): repeats do not shrink the SE; only items do")
    mde = reps_needed = far = drop = None
    if n_items is not None and n_items > 1:
        se_pair = sd / math.sqrt(n_items)
        mde = (z_a + z_b) * se_pair
        if within_share > 0:
            reps_needed = repeats_needed(sd, sd * math.sqrt(within_share), 1, n_items, margin, alpha, power)
        elif mde <= margin:
            reps_needed = 1
        se_base = math.sqrt(accuracy * (1 - accuracy) / n_items)
        if se_pair > 0:
            far = float(2 * stats.norm.sf(k * se_base / se_pair))
            drop = k * se_base + z_b * se_pair
    return SampleSizePlan(task=task, margin=margin, alpha=alpha, power=power, accuracy=accuracy, rho=rho,
                within_share=within_share, sd_diff=sd, source=source, rows=rows, n_items=n_items,
                mde_at_n=mde, repeats_needed_at_n=reps_needed, sigma_rule_false_alarm=far,
                sigma_rule_drop_caught_80=drop, notes=notes)
