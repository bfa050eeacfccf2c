"""Pair baseline and candidate records: join on (task, item id, repeat), refuse mismatched arms,
and reduce each (task, metric, filter) to per-item means (repeats averaged before differencing); the
per-sample generation fields (truncated, output_tokens) are reduced the same way.

Refusals are one-line `PairingError`s naming counts and a few ids: tasks present in one arm only,
item/repeat sets that differ, prompt, target or task-version mismatches, duplicate samples.
A sample without a score for a metric (an error) is dropped from *both* arms for that metric and
counted, never turned into a wrong answer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from evals.records.samples import SampleRecord
from qa.errors import PairingError

_SHOW = 3  # ids named in an error message
GenerationField = Literal["truncated", "output_tokens"]  # per-sample fields compared like scores


@dataclass(frozen=True)
class PairedTask:
    """The aligned samples of one task: `baseline[i]` and `candidate[i]` share (item id, repeat)."""

    task: str
    task_version: str
    baseline: tuple[SampleRecord, ...]
    candidate: tuple[SampleRecord, ...]


@dataclass(frozen=True)
class PairedMetric:
    """One (task, metric, filter) reduced for the statistics. Arrays of length n are per item
    (means over the repeats scored in both arms); arrays of length m are per (item, repeat) pair."""

    task: str
    task_version: str
    metric: str
    filter: str
    item_ids: tuple[str, ...]  # (n,)
    clusters: tuple[str, ...]  # (n,) cluster key, or the item id when the record has none
    base: np.ndarray  # (n,) float64, baseline per-item mean
    cand: np.ndarray  # (n,) float64, candidate per-item mean
    repeats: np.ndarray  # (n,) int, repeats scored in both arms
    pair_item: np.ndarray  # (m,) int index into the n items
    pair_base: np.ndarray  # (m,) float64 raw baseline scores
    pair_cand: np.ndarray  # (m,) float64 raw candidate scores
    n_errors_baseline: int
    n_errors_candidate: int
    n_dropped_items: int
    binary: bool  # every raw score is 0 or 1
    extracted_same: np.ndarray | None  # (m,) bool: same extracted answer for this filter (generative)
    completion_same: np.ndarray | None  # (m,) bool: same full completion (generative)


def split_key(key: str) -> tuple[str, str]:
    """("metric", "filter") from an lm-eval style score key "metric,filter" (no comma: "none")."""
    metric, sep, filt = key.partition(",")
    return (metric, filt) if sep else (metric, "none")


def _ids(keys: Iterable[tuple[str, int]]) -> str:
    ks = sorted(keys)
    shown = ", ".join(f"{i}" if r == 0 else f"{i}#{r}" for i, r in ks[:_SHOW])
    return shown + (", ..." if len(ks) > _SHOW else "")


def _by_task(records: Iterable[SampleRecord], arm: str) -> dict[str, dict[tuple[str, int], SampleRecord]]:
    out: dict[str, dict[tuple[str, int], SampleRecord]] = defaultdict(dict)
    for r in records:
        if r.key in out[r.task]:
            raise PairingError(
                f"{arm} task {r.task}: duplicate sample for item {r.item_id!r} repeat {r.repeat}; "
                "the records folder mixes two runs"
            )
        out[r.task][r.key] = r
    return out


def pair_records(baseline: Iterable[SampleRecord], candidate: Iterable[SampleRecord]) -> list[PairedTask]:
    """Join the two arms per task on (item id, repeat); PairingError when they cannot be paired."""
    base, cand = _by_task(baseline, "baseline"), _by_task(candidate, "candidate")
    if not base or not cand:
        which = "baseline" if not base else "candidate"
        raise PairingError(f"the {which} arm has no records; point it at a records or lm-eval samples folder")
    only_b, only_c = sorted(set(base) - set(cand)), sorted(set(cand) - set(base))
    if only_b or only_c:
        raise PairingError(
            f"task sets differ: {len(only_b)} only in baseline ({', '.join(only_b[:_SHOW]) or '-'}), "
            f"{len(only_c)} only in candidate ({', '.join(only_c[:_SHOW]) or '-'}); run the same tasks in both arms"
        )
    out: list[PairedTask] = []
    for task in sorted(base):
        b, c = base[task], cand[task]
        kb, kc = set(b), set(c)
        if kb != kc:
            raise PairingError(
                f"task {task}: item sets differ: {len(b)} baseline vs {len(c)} candidate samples, "
                f"{len(kb - kc)} only in baseline ({_ids(kb - kc) or '-'}), {len(kc - kb)} only in candidate "
                f"({_ids(kc - kb) or '-'}); finish or re-run the missing samples (same limit and repeats)"
            )
        keys = sorted(kb)
        vb = {b[k].task_version for k in keys}
        vc = {c[k].task_version for k in keys}
        if vb != vc or len(vb) != 1:
            raise PairingError(
                f"task {task}: task versions differ (baseline {sorted(vb)}, candidate {sorted(vc)}); "
                "re-run both arms with the same toolkit version"
            )
        bad_prompt = [k for k in keys if b[k].prompt_hash != c[k].prompt_hash]
        if bad_prompt:
            raise PairingError(
                f"task {task}: prompt hashes differ on {len(bad_prompt)} of {len(keys)} samples "
                f"({_ids(bad_prompt)}); the arms saw different prompts (few-shot, template or chat format)"
            )
        bad_target = [
            k for k in keys if b[k].target_hash and c[k].target_hash and b[k].target_hash != c[k].target_hash
        ]
        if bad_target:
            raise PairingError(
                f"task {task}: target hashes differ on {len(bad_target)} of {len(keys)} samples "
                f"({_ids(bad_target)}); the arms used different data files"
            )
        bad_cluster = [k for k in keys if b[k].cluster != c[k].cluster]
        if bad_cluster:
            raise PairingError(
                f"task {task}: cluster keys differ on {len(bad_cluster)} samples ({_ids(bad_cluster)}); "
                "re-run both arms with the same task version"
            )
        out.append(PairedTask(task, vb.pop(), tuple(b[k] for k in keys), tuple(c[k] for k in keys)))
    return out


def score_keys(pt: PairedTask) -> list[str]:
    """Every "metric,filter" key scored in either arm of a task, sorted."""
    keys: set[str] = set()
    for r in (*pt.baseline, *pt.candidate):
        keys.update(r.scores)
    return sorted(keys)


def paired_metric(pt: PairedTask, key: str) -> PairedMetric:
    """Reduce one "metric,filter" of a paired task to per-item means (repeats averaged first)."""
    metric, filt = split_key(key)
    return _reduce(pt, metric, filt, [r.scores.get(key) for r in pt.baseline],
                   [r.scores.get(key) for r in pt.candidate], generative=True)


def _field(r: SampleRecord, name: GenerationField) -> float | None:
    value = r.truncated if name == "truncated" else r.output_tokens
    return None if value is None else float(value)


def paired_generation(pt: PairedTask, name: GenerationField) -> PairedMetric:
    """One per-sample generation field reduced like a score (metric `name`, filter "none"):
    "truncated" is 1.0 for a sample that reached max_tokens before its final answer, 0.0 for a
    finished one; "output_tokens" is the token count. A sample where either arm did not record it
    is dropped from both and counted in that arm's n_errors (here: not recorded)."""
    return _reduce(pt, name, "none", [_field(r, name) for r in pt.baseline],
                   [_field(r, name) for r in pt.candidate], generative=False)


def _reduce(pt: PairedTask, metric: str, filt: str, values_b: list[float | None], values_c: list[float | None],
            generative: bool) -> PairedMetric:
    err_b = err_c = 0
    kept: list[int] = []  # indices into pt.baseline / pt.candidate
    for i, (sb, sc) in enumerate(zip(values_b, values_c, strict=True)):
        err_b += sb is None
        err_c += sc is None
        if sb is not None and sc is not None:
            kept.append(i)
    all_items = {r.item_id for r in pt.baseline}
    order: dict[str, int] = {}
    for i in kept:
        order.setdefault(pt.baseline[i].item_id, len(order))
    n, m = len(order), len(kept)
    pair_item = np.fromiter((order[pt.baseline[i].item_id] for i in kept), dtype=np.int64, count=m)
    pair_base = np.fromiter((values_b[i] for i in kept), dtype=np.float64, count=m)
    pair_cand = np.fromiter((values_c[i] for i in kept), dtype=np.float64, count=m)
    repeats = np.bincount(pair_item, minlength=n)
    base = np.bincount(pair_item, weights=pair_base, minlength=n) / np.maximum(repeats, 1)
    cand = np.bincount(pair_item, weights=pair_cand, minlength=n) / np.maximum(repeats, 1)
    clusters = [""] * n
    for i in kept:
        r = pt.baseline[i]
        clusters[order[r.item_id]] = r.cluster if r.cluster is not None else f"item:{r.item_id}"
    extracted_same = completion_same = None
    if generative and any(pt.baseline[i].completion is not None for i in kept):
        extracted_same = np.array(
            [pt.baseline[i].extracted.get(filt) == pt.candidate[i].extracted.get(filt) for i in kept], dtype=bool
        )
        completion_same = np.array(
            [pt.baseline[i].completion == pt.candidate[i].completion for i in kept], dtype=bool
        )
    binary = bool(np.isin(pair_base, (0.0, 1.0)).all() and np.isin(pair_cand, (0.0, 1.0)).all())
    return PairedMetric(
        task=pt.task,
        task_version=pt.task_version,
        metric=metric,
        filter=filt,
        item_ids=tuple(order),
        clusters=tuple(clusters),
        base=base,
        cand=cand,
        repeats=repeats,
        pair_item=pair_item,
        pair_base=pair_base,
        pair_cand=pair_cand,
        n_errors_baseline=err_b,
        n_errors_candidate=err_c,
        n_dropped_items=len(all_items) - n,
        binary=binary,
        extracted_same=extracted_same,
        completion_same=completion_same,
    )


def paired_metrics(tasks: Sequence[PairedTask]) -> list[PairedMetric]:
    """Every (task, metric, filter) of the paired tasks that has a score key, in sorted order."""
    return [paired_metric(pt, key) for pt in tasks for key in score_keys(pt)]
