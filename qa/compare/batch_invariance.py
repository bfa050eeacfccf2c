"""Batch invariance: which items change between concurrency 1 and N, per arm, and the candidate against the baseline.

Four record folders: the baseline and the candidate each served alone (`load = { concurrency = 1 }`) and under
load (`concurrency = N`, evals.engines.load). Per arm an item (item, repeat) is *changed* when its outcome
differs between the two levels: its scores, its extracted answer or whether it failed. The candidate's change
rate is set against the baseline's as a paired difference on the items present in all four folders,
d_i = changed_cand_i - changed_base_i (positive: the candidate's outcome moved where the baseline's did not), with
Tango's score interval for a paired difference of proportions (qa.stats.paired_tests, as the binary
non-inferiority rule). Where the task has reference answers, the mean absolute shift of the reference answer's
log-prob (nats per token) between the levels is compared the same way, with the paired t interval.
Numbers only: the rule that decides is qa.gate.batch_invariance.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from evals.records.samples import SampleRecord, iter_arm_records
from qa.errors import QAError
from qa.files.comparison import Interval
from qa.stats.basic import t_interval
from qa.stats.paired_tests import discordant_items, tango_interval
from quant.fileio import atomic_write_text

INVARIANCE_FILE = "batch_invariance.json"
LEVELS = (0.90, 0.95)  # the stored intervals: 90% (the gate at alpha 0.05) and 95%

Key = tuple[str, str, int]  # (task, item_id, repeat)


@dataclass(frozen=True)
class LoadArms:
    """The four record folders (records/<arm>) batch invariance reads."""

    baseline_alone: Path
    baseline_loaded: Path
    candidate_alone: Path
    candidate_loaded: Path


class RefShift(BaseModel):
    """Mean absolute shift of the reference answer's log-prob (nats/token) between the levels, per arm."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int
    baseline: float
    candidate: float
    delta: float  # candidate - baseline
    ci90: Interval | None  # paired t; None below 2 items
    ci95: Interval | None


class TaskInvariance(BaseModel):
    """One task's batch invariance: the two arms' change rates and their paired difference."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: str
    n: int  # items (item, repeat) in all four folders (a failed sample's outcome is its failure)
    baseline_changed: int
    candidate_changed: int
    n01: int  # the candidate changed, the baseline did not
    n10: int  # the baseline changed, the candidate did not
    baseline_rate: float
    candidate_rate: float
    delta: float  # candidate_rate - baseline_rate
    ci90: Interval
    ci95: Interval
    changed_items: dict[str, list[str]]  # "baseline" / "candidate" -> the changed items' "<item_id>#<repeat>"
    reference: RefShift | None = None


class BatchInvariance(BaseModel):
    """batch_invariance.json: per task, the candidate's change rate between concurrency 1 and N vs the baseline's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arms: dict[str, str]  # LoadArms field -> the records folder's name
    tasks: list[TaskInvariance]

    def save(self, path: Path) -> None:
        """Write the file atomically (sorted keys, two-space indent)."""
        atomic_write_text(path, json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: Path) -> BatchInvariance:
        """Read the file; QAError (one line) when it is missing or not this schema."""
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise QAError(f"{path}: not a batch-invariance file ({type(exc).__name__})") from None


def outcome(rec: SampleRecord) -> str:
    """What a record's outcome is, as one comparable string: its scores, extracted answers, or its failure."""
    if rec.error is not None:
        return "error"
    return json.dumps({"scores": rec.scores, "extracted": rec.extracted}, sort_keys=True)


def reference_mean(rec: SampleRecord) -> float | None:
    """The reference answer's mean log-prob per token (None: the record has none)."""
    ref = rec.reference_logprobs
    if ref is None or not ref.target_logprobs:
        return None
    return float(np.mean(ref.target_logprobs))


def _by_key(records: Iterable[SampleRecord]) -> dict[Key, SampleRecord]:
    return {(r.task, r.item_id, r.repeat): r for r in records}


def interval_pair(n01: int, n10: int, n: int) -> tuple[Interval, Interval]:
    """Tango's 90% and 95% intervals of a paired difference of proportions (candidate - baseline)."""
    return tango_interval(n01, n10, n, LEVELS[0]), tango_interval(n01, n10, n, LEVELS[1])


def ref_shift(pairs: list[tuple[float, float, float, float]]) -> RefShift | None:
    """RefShift of (base alone, base loaded, cand alone, cand loaded) reference means per item."""
    if not pairs:
        return None
    a = np.array(pairs)  # (n, 4)
    base, cand = np.abs(a[:, 1] - a[:, 0]), np.abs(a[:, 3] - a[:, 2])
    d = cand - base  # (n,)
    cis: list[Interval | None] = [None, None]
    if len(d) >= 2:
        se = float(np.std(d, ddof=1) / np.sqrt(len(d)))
        cis = [t_interval(float(d.mean()), se, len(d) - 1, lvl) for lvl in LEVELS]
    return RefShift(n=len(d), baseline=float(base.mean()), candidate=float(cand.mean()), delta=float(d.mean()),
                    ci90=cis[0], ci95=cis[1])


def task_invariance(task: str, arms: list[dict[Key, SampleRecord]]) -> TaskInvariance:
    """One task's numbers from the four arms' records (in LoadArms order), paired on the keys all four hold."""
    keys = sorted(set.intersection(*({k for k in a if k[0] == task} for a in arms)))
    if not keys:
        raise QAError(f"batch invariance: task {task!r} has no item in all four arms")
    bl, bL, cl, cL = arms
    base = np.array([outcome(bl[k]) != outcome(bL[k]) for k in keys], dtype=float)  # (n,)
    cand = np.array([outcome(cl[k]) != outcome(cL[k]) for k in keys], dtype=float)
    n10, n01 = discordant_items(cand - base)
    ci90, ci95 = interval_pair(n01, n10, len(keys))
    refs = [(m[0], m[1], m[2], m[3]) for k in keys
            if None not in (m := [reference_mean(a[k]) for a in arms])]  # type: ignore[misc]
    label = [f"{k[1]}#{k[2]}" for k in keys]
    return TaskInvariance(
        task=task, n=len(keys), baseline_changed=int(base.sum()), candidate_changed=int(cand.sum()), n01=n01,
        n10=n10, baseline_rate=float(base.mean()), candidate_rate=float(cand.mean()),
        delta=float(cand.mean() - base.mean()), ci90=ci90, ci95=ci95,
        changed_items={"baseline": [x for x, c in zip(label, base) if c], "candidate": [x for x, c in zip(label, cand) if c]},
        reference=ref_shift(refs),  # type: ignore[arg-type]
    )


def batch_invariance(arms: LoadArms, out: Path | None = None) -> BatchInvariance:
    """Every task's batch invariance from the four record folders; with `out`, written there as batch_invariance.json."""
    folders = (arms.baseline_alone, arms.baseline_loaded, arms.candidate_alone, arms.candidate_loaded)
    for folder in folders:
        if not folder.is_dir():
            raise QAError(f"{folder}: no such records folder (batch invariance reads records/<arm>)")
    loaded = [_by_key(iter_arm_records(f)) for f in folders]
    tasks = sorted({k[0] for k in loaded[0]})
    result = BatchInvariance(arms={n: f.name for n, f in zip(LoadArms.__dataclass_fields__, folders)},
                             tasks=[task_invariance(t, loaded) for t in tasks])
    if out is not None:
        result.save(out / INVARIANCE_FILE)
    return result
