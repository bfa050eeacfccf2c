"""One `Estimate` per (task, metric, filter) from paired records: numbers only (means, SEs, the
interval method and its 90%/95% intervals, tests, counts). Nothing here depends on a margin or a
policy; `qa.gate.rules` decides. Sources: see `qa.stats`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from qa.compare.direction import higher_is_better
from qa.compare.pairing import PairedMetric, PairedTask, paired_metric
from qa.files.comparison import Agreement, CIMethod, Estimate, ExcessFlips, Multiplicity, StatsSettings
from qa.stats.basic import cluster_mean_se, flips, gate_mean_se, share, wilson
from qa.stats.bootstrap import bootstrap_delta
from qa.stats.intervals import delta_interval, is_degenerate, p_two_sided
from qa.stats.multiplicity import benjamini_hochberg
from qa.stats.paired_tests import discordant_items, mcnemar

STORED_LEVELS = (0.90, 0.95)  # two-sided levels whose intervals comparison.json carries


def within_sd(pm: PairedMetric) -> float | None:
    """Pooled within-item sd of the per-repeat differences (items with >= 2 repeats), ddof = 1."""
    if int(pm.repeats.max(initial=0)) < 2:
        return None
    d = pm.pair_cand - pm.pair_base
    mean_i = np.bincount(pm.pair_item, weights=d, minlength=len(pm.base)) / np.maximum(pm.repeats, 1)
    ss = np.bincount(pm.pair_item, weights=(d - mean_i[pm.pair_item]) ** 2, minlength=len(pm.base))
    dof = pm.repeats - 1
    use = dof > 0
    return float(math.sqrt(ss[use].sum() / dof[use].sum()))


def _method(pm: PairedMetric, d: np.ndarray, se_p: float | None, df: int, clustered: bool, discordant: int,
            score_range: float, settings: StatsSettings) -> tuple[CIMethod, str | None]:
    t_method: CIMethod = "cluster_cr1_t" if clustered else "paired_t"
    if se_p is None or df < 1:
        return t_method, f"SE undefined ({'fewer than 2 clusters' if clustered else 'fewer than 2 items'})"
    repeats = int(pm.repeats.max(initial=0))
    if pm.binary and repeats == 1 and not clustered and discordant < settings.tango_max_discordant:
        return "tango_score", None
    if is_degenerate(d, score_range):
        c = float(d[0])
        what = "is 0" if c == 0 else f"equals {c:g}"
        return "degenerate", (f"every paired difference {what}: intervals are the exact binomial bound on the "
                              "share of items that could differ (0 of n observed), times the score range")
    return t_method, None


def estimate(pm: PairedMetric, settings: StatsSettings) -> Estimate:
    """All statistics of one (task, metric, filter); delta = candidate - baseline; items better / worse,
    McNemar's discordant counts and flips by the metric's direction (qa.compare.direction)."""
    n = len(pm.base)
    a, b = pm.base, pm.cand
    d = b - a  # (n,) candidate - baseline per item
    clustered = len(set(pm.clusters)) < n
    clusters = pm.clusters if clustered else None
    repeats = int(pm.repeats.max(initial=0))
    common = {"task": pm.task, "metric": pm.metric, "filter": pm.filter, "task_version": pm.task_version,
                  "binary": pm.binary, "n_errors_baseline": pm.n_errors_baseline,
                  "n_errors_candidate": pm.n_errors_candidate, "n_dropped_items": pm.n_dropped_items}
    if n == 0:
        return Estimate(**common, n=0, repeats=0, n_clusters=0, ci_method="paired_t",
                        notes=["no item has a score in both arms"])
    notes: list[str] = []
    mean_a, se_a, _, _ = gate_mean_se(a, clusters)  # the k-SE rule reads se_a: floored as the delta's SE
    mean_b, se_b, _, _ = gate_mean_se(b, clusters)
    delta, se_p, df, floored = gate_mean_se(d, clusters)
    if floored:
        notes.append(f"the cluster-robust SE of the difference is below the item-level SE ({len(set(pm.clusters))} "
                     "clusters): the item-level SE is used, with G - 1 df")
    se_unp = math.sqrt(se_a**2 + se_b**2) if se_a is not None and se_b is not None else None
    sd_a, sd_b = (float(np.std(x, ddof=1)) if n > 1 else None for x in (a, b))
    rho = float(np.corrcoef(a, b)[0, 1]) if sd_a and sd_b else None
    score_range = max(1.0, float(np.max(np.abs(np.concatenate([a, b])))))
    up = higher_is_better(pm.metric)
    below, above = discordant_items(d)  # items with d < 0, d > 0
    n10, n01 = (below, above) if up else (above, below)  # candidate worse (regressions), better (improvements)
    mcn = mcnemar(n10, n01, repeats) if pm.binary else None
    if mcn is not None and n10 == n01:
        notes.append(f"{'McNemar' if repeats <= 1 else 'sign test on items'}: n10 == n01, p = 1 by convention")
    method, note = _method(pm, d, se_p, df, clustered, n10 + n01, score_range, settings)
    if note:
        notes.append(note)
    agreement = None
    if pm.extracted_same is not None or pm.completion_same is not None:
        agreement = Agreement(extracted=share(pm.extracted_same), completion=share(pm.completion_same))
    est = Estimate(
        **common, n=n, repeats=repeats, n_clusters=len(set(pm.clusters)),
        mean_baseline=mean_a, mean_candidate=mean_b, delta=delta,
        sd_baseline=sd_a, sd_candidate=sd_b,
        se_baseline=se_a, se_candidate=se_b, se_unpaired=se_unp, se_paired=se_p,
        sd_diff=se_p * math.sqrt(n) if se_p is not None else None, sd_within=within_sd(pm),
        df=df if se_p is not None else None, rho=rho, score_range=score_range,
        items_worse=n10, items_better=n01, higher_is_better=up, ci_method=method,
        mcnemar=mcn, flips=flips(pm.pair_base, pm.pair_cand, up), agreement=agreement,
        bootstrap=bootstrap_delta(d, clusters, settings.bootstrap_n, settings.seed) if settings.bootstrap_n else None,
        notes=notes,
    )
    ci90, ci95 = (delta_interval(est, level) for level in STORED_LEVELS)
    return est.model_copy(update={"ci90": ci90, "ci95": ci95,
                                  "multiplicity": Multiplicity(p_diff=p_two_sided(est), q_bh=None)})


def excess_flips(cand_pair: PairedTask, rerun_pair: PairedTask, key: str) -> ExcessFlips | None:
    """Excess-flip test of the candidate over a baseline rerun for one "metric,filter"
    (docs/STATISTICS.md, "The noise floor (A/A)"). Both pairs share the baseline, so their keys line up."""
    assert [r.key for r in rerun_pair.baseline] == [r.key for r in cand_pair.baseline]
    rows = [
        (rb.scores.get(key), rc.scores.get(key), rr.scores.get(key))
        for rb, rc, rr in zip(cand_pair.baseline, cand_pair.candidate, rerun_pair.candidate, strict=True)
    ]
    kept = np.array([r for r in rows if None not in r], dtype=np.float64).reshape(-1, 3)  # (m, 3): base, cand, rerun
    if kept.shape[0] == 0:
        return None
    aa = paired_metric(rerun_pair, key)
    aa_clusters = aa.clusters if len(set(aa.clusters)) < len(aa.base) else None
    aa_delta, aa_se, _ = cluster_mean_se(aa.cand - aa.base, aa_clusters)
    return flip_excess(kept[:, 1] != kept[:, 0], kept[:, 2] != kept[:, 0],
                       aa_delta if len(aa.base) else None, aa_delta / aa_se if aa_se else None)


def flip_excess(x: np.ndarray, y: np.ndarray, aa_delta: float | None, aa_z: float | None) -> ExcessFlips:
    """The excess-flip sign test from two flip masks (m,) bool over the same samples: x the candidate's
    flips, y the floor's (rerun's); exact one-sided, H1: x-only flips outnumber y-only ones."""
    only_c, only_r = int(np.sum(x & ~y)), int(np.sum(~x & y))
    m = only_c + only_r
    p = float(stats.binomtest(only_c, m, 0.5, alternative="greater").pvalue) if m else 1.0
    n = int(x.size)
    return ExcessFlips(
        n=n, flips_candidate=int(x.sum()), flips_rerun=int(y.sum()), only_candidate=only_c, only_rerun=only_r,
        p_excess=p, rerun_rate=float(y.sum()) / n if n else 0.0, rerun_ci95=wilson(int(y.sum()), n),
        aa_delta=aa_delta, aa_z=aa_z,
    )


def adjust_multiplicity(estimates: Sequence[Estimate]) -> list[Estimate]:
    """Benjamini-Hochberg on the two-sided p for delta = 0 across the estimates that have one (flags
    for sub-tasks, never the gate). Returns new estimates."""
    out = list(estimates)
    have = [i for i, e in enumerate(out) if e.multiplicity is not None and e.multiplicity.p_diff is not None]
    q = benjamini_hochberg([out[i].multiplicity.p_diff for i in have])  # type: ignore[misc]
    q_of = {i: float(v) for i, v in zip(have, q, strict=True)}
    for i, e in enumerate(out):
        p_diff = e.multiplicity.p_diff if e.multiplicity is not None else None
        out[i] = e.model_copy(update={"multiplicity": Multiplicity(p_diff=p_diff, q_bh=q_of.get(i))})
    return out
