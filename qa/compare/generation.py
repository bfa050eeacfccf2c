"""Truncation and output length of a generative task: per-arm truncation rates with their intervals,
mean output tokens, and the paired changes (one `GenerationEstimate` per task; numbers only).

A sample is truncated when it reached max_tokens before its final answer (`SampleRecord.truncated`,
None when not recorded). The paired changes reuse the accuracy machinery (`qa.compare.estimate`) on
the per-sample values 1.0 / 0.0 (truncated) and the token counts, so their intervals, methods and
re-gating at another alpha are the same as for accuracy.

Per-arm interval: Wilson's for k of m independent samples. With repeats (or cluster keys) samples of
one cluster are correlated, so Wilson's is taken on the effective sample size m_eff = p (1 - p) / SE^2,
SE the CR1 cluster-robust SE of the rate (Korn & Graubard 1998; Dean & Pagano 2015), capped at m;
at p = 0 or 1 that ratio is undefined and m_eff is the number of clusters (each counted once).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from qa.compare.estimate import estimate
from qa.compare.pairing import PairedMetric, PairedTask, paired_generation
from qa.files.comparison import ArmGeneration, Estimate, GenerationEstimate, Interval, StatsSettings
from qa.stats.basic import cluster_mean_se, wilson, wilson_bounds


def rate_interval(values: np.ndarray, clusters: np.ndarray, conf: float = 0.95) -> Interval:
    """Interval of the share of 1s in `values` (m,) whose samples belong to `clusters` (m,): Wilson,
    on the effective sample size when clusters hold several samples (see the module docstring)."""
    m = int(values.size)
    k = float(values.sum())
    n_clusters = len(np.unique(clusters))
    if m == 0 or n_clusters == m:
        return wilson(int(k), m, conf)
    p = k / m
    if p in (0.0, 1.0):
        m_eff = float(n_clusters)
    else:
        _, se, _ = cluster_mean_se(values, clusters)
        m_eff = m if not se else min(float(m), p * (1 - p) / se**2)
    lo, hi = wilson_bounds(p * m_eff, m_eff, conf)
    return Interval(lower=lo, upper=hi)


def _sample_clusters(pm: PairedMetric) -> np.ndarray:
    return np.asarray(pm.clusters, dtype=object)[pm.pair_item].astype(str)  # (m,) cluster of each sample


def _arm(trunc: PairedMetric, tokens: PairedMetric, side: Literal["baseline", "candidate"]) -> ArmGeneration:
    out: dict[str, object] = {"n_samples": 0, "truncated": 0}
    if trunc.pair_base.size:
        values = trunc.pair_base if side == "baseline" else trunc.pair_cand
        out.update(n_samples=int(values.size), truncated=int(values.sum()),
                   truncation_rate=float(values.mean()),
                   truncation_ci95=rate_interval(values, _sample_clusters(trunc)))
    if tokens.pair_base.size:
        values = tokens.pair_base if side == "baseline" else tokens.pair_cand
        out.update(n_output_tokens=int(values.size), mean_output_tokens=float(values.mean()))
    return ArmGeneration.model_validate(out)


def _paired(pm: PairedMetric, settings: StatsSettings) -> Estimate | None:
    if not pm.pair_base.size:
        return None
    # No bootstrap: the gate reads the interval by the estimate's own method, as for accuracy.
    return estimate(pm, settings.model_copy(update={"bootstrap_n": 0}))


def generation_estimate(pt: PairedTask, settings: StatsSettings) -> GenerationEstimate | None:
    """Truncation rates, output lengths and their paired changes for one paired task; None when
    neither is recorded in both arms of any sample (log-likelihood tasks, older records)."""
    trunc = paired_generation(pt, "truncated")
    tokens = paired_generation(pt, "output_tokens")
    if not trunc.pair_base.size and not tokens.pair_base.size:
        return None
    return GenerationEstimate(
        task=pt.task,
        n_unrecorded=len(pt.baseline) - int(trunc.pair_base.size),
        baseline=_arm(trunc, tokens, "baseline"),
        candidate=_arm(trunc, tokens, "candidate"),
        truncation=_paired(trunc, settings),
        output_tokens=_paired(tokens, settings),
    )
