"""Paired records -> Estimate helpers for the statistics and gate tests."""

from __future__ import annotations

import numpy as np

from evals.records.samples import SampleRecord
from qa.compare.estimate import estimate
from qa.compare.pairing import pair_records, paired_metric
from qa.files.comparison import Estimate, StatsSettings

SETTINGS = StatsSettings(bootstrap_n=200, seed=0)


def recs(arm: str, scores: dict[tuple[str, int], float | None], *, task: str = "t",
         clusters: dict[str, str] | None = None, key: str = "acc,none") -> list[SampleRecord]:
    """One record per (item id, repeat) with a single score."""
    return [
        SampleRecord(task=task, task_version="1", arm=arm, item_id=i, repeat=r, prompt_hash=f"p{i}",
                     cluster=(clusters or {}).get(i), scores={key: v})
        for (i, r), v in scores.items()
    ]


def est_of(a, b, *, settings: StatsSettings = SETTINGS, clusters=None, task: str = "t") -> Estimate:
    """Estimate for per-(item, repeat) score arrays a, b of shape (n,) or (n, repeats)."""
    a, b = np.asarray(a, float).reshape(len(a), -1), np.asarray(b, float).reshape(len(b), -1)
    cl = {f"{i:04d}": clusters[i] for i in range(len(a))} if clusters is not None else None
    sa = {(f"{i:04d}", r): float(a[i, r]) for i in range(len(a)) for r in range(a.shape[1])}
    sb = {(f"{i:04d}", r): float(b[i, r]) for i in range(len(b)) for r in range(b.shape[1])}
    pt = pair_records(recs("base", sa, task=task, clusters=cl), recs("cand", sb, task=task, clusters=cl))[0]
    return estimate(paired_metric(pt, "acc,none"), settings)


def continuous(n: int, seed: int, shift: float = 0.0, noise: float = 0.1):
    """Uniform baseline scores and a candidate shifted by `shift` plus noise, clipped to [0, 1]."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 1, n)
    b = np.clip(a + shift + rng.normal(0, noise, n), 0, 1)
    return a, b
