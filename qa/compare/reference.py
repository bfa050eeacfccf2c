"""The reference-answer signal of one paired task: each item's reference answer (GSM8K's worked solution,
the gold choice, MATH-500's solution, the needle's value) teacher-forced after its prompt in both arms
(SampleRecord.reference_logprobs), compared per item.

Per (item, repeat) pair with the reference scored in both arms, over the T reference tokens:
  delta_logprob = mean_t (log p_cand(ref_t) - log p_base(ref_t))   nats/token; < 0: the candidate finds
                                                                   the right answer less likely
  kld           = mean_t KL(base_t || cand_t)                      nats/token, top-k + tail bucket
                                                                   (qa.compare.distribution.topk_kl, a lower bound)
Repeats of an item are averaged first and one item is one unit (each item weighs the same, whatever
its length); the mean over items has a CR1 SE over the items' cluster keys (an item without one is its
own cluster, G - 1 df), as qa.compare.distribution clusters by chunk. Numbers only: qa.gate.reference decides.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from evals.records.samples import SampleRecord
from qa.compare.distribution import token_stats
from qa.compare.pairing import PairedTask
from qa.errors import PairingError
from qa.files.comparison import ReferenceEstimate, ReferenceStat
from qa.stats.basic import gate_mean_se, t_interval

REFERENCE_ERROR_KEY = "reference_error"  # evals.run.reference.META_KEY: the engine could not score it
METHOD_NOTE = ("per item (repeats averaged first): mean over the reference tokens of log p_cand - log p_base and "
               "of KL(base || cand) (top-k + tail bucket, a lower bound); SE CR1 over clusters of items")


@dataclass(frozen=True)
class ItemReference:
    """One item's statistics, averaged over its paired repeats."""

    item_id: str
    cluster: str
    delta_logprob: float  # nats/token
    kld: float  # nats/token
    logprob_baseline: float  # mean log-prob of the reference tokens, baseline
    logprob_candidate: float
    n_tokens: int  # reference tokens (first paired repeat)
    token_kld: np.ndarray  # (T,) per-token KL of the first paired repeat


def has_reference(pt: PairedTask) -> bool:
    """True when either arm's records carry reference log-probs or say why they could not."""
    return any(r.reference_logprobs is not None or REFERENCE_ERROR_KEY in r.meta
               for r in (*pt.baseline, *pt.candidate))


def _unavailable(records: tuple[SampleRecord, ...]) -> str | None:
    """The first "could not score" reason of an arm that has no reference log-probs at all."""
    if any(r.reference_logprobs is not None for r in records):
        return None
    return next((str(r.meta[REFERENCE_ERROR_KEY]) for r in records if REFERENCE_ERROR_KEY in r.meta), None)


def item_references(pt: PairedTask) -> tuple[list[ItemReference], int, int]:
    """(per-item statistics in first-seen order, samples missing in an arm, samples whose arms scored
    different reference tokens: another tokenizer) of one paired task."""
    per_item: dict[str, list[tuple[float, float, float, float, np.ndarray]]] = defaultdict(list)
    clusters: dict[str, str] = {}
    missing = mismatched = 0
    for rb, rc in zip(pt.baseline, pt.candidate, strict=True):
        b, c = rb.reference_logprobs, rc.reference_logprobs
        if b is None or c is None or not b.target_ids:
            missing += 1
            continue
        try:
            ts = token_stats(b, c)
        except PairingError:
            mismatched += 1
            continue
        lp_b, lp_c = float(np.mean(b.target_logprobs)), float(np.mean(c.target_logprobs))
        per_item[rb.item_id].append((lp_c - lp_b, float(np.mean(ts.kld)), lp_b, lp_c, ts.kld))
        clusters.setdefault(rb.item_id, rb.cluster if rb.cluster is not None else f"item:{rb.item_id}")
    items = []
    for item_id, rows in per_item.items():
        cols = np.asarray([r[:4] for r in rows], dtype=np.float64).mean(axis=0)  # (4,) repeats averaged
        items.append(ItemReference(item_id=item_id, cluster=clusters[item_id], delta_logprob=float(cols[0]),
                                   kld=float(cols[1]), logprob_baseline=float(cols[2]),
                                   logprob_candidate=float(cols[3]), n_tokens=len(rows[0][4]), token_kld=rows[0][4]))
    return items, missing, mismatched


def _stat(x: np.ndarray, clusters: list[str]) -> ReferenceStat:
    value, se, df, _ = gate_mean_se(x, clusters)
    ci = t_interval(value, se, df, 0.95) if se is not None else None
    return ReferenceStat(value=value, se=se, df=df if se is not None else None, ci95=ci)


def reference_estimate(pt: PairedTask, floor: PairedTask | None = None) -> ReferenceEstimate | None:
    """The task's reference-answer estimate (None when neither arm's records have a reference);
    `floor` (baseline vs its rerun) adds the A/A values of both means."""
    if not has_reference(pt):
        return None
    items, missing, mismatched = item_references(pt)
    notes = [METHOD_NOTE]
    if mismatched:
        notes.append(f"{mismatched} samples skipped: the arms scored different reference tokens (another tokenizer)")
    if not items:
        why = _unavailable(pt.baseline) or _unavailable(pt.candidate) or "no sample has reference log-probs in both arms"
        return ReferenceEstimate(task=pt.task, n=0, n_clusters=0, n_tokens=0, n_missing=missing, unavailable=why,
                                 notes=notes)
    if missing:
        notes.append(f"{missing} paired samples without reference log-probs in an arm were left out")
    clusters = [it.cluster for it in items]
    delta = np.asarray([it.delta_logprob for it in items])  # (n,)
    kld = np.asarray([it.kld for it in items])  # (n,)
    tokens = np.concatenate([it.token_kld for it in items])  # (sum T,)
    floor_est = reference_estimate(floor) if floor is not None else None
    return ReferenceEstimate(
        task=pt.task, n=len(items), n_clusters=len(set(clusters)), n_tokens=int(sum(it.n_tokens for it in items)),
        n_missing=missing, mean_logprob_baseline=float(np.mean([it.logprob_baseline for it in items])),
        mean_logprob_candidate=float(np.mean([it.logprob_candidate for it in items])),
        delta_logprob=_stat(delta, clusters), kld=_stat(kld, clusters),
        kld_p99=float(np.percentile(tokens, 99)), kld_max=float(np.max(tokens)),
        floor_delta_logprob=floor_est.delta_logprob.value if floor_est and floor_est.delta_logprob else None,
        floor_kld=floor_est.kld.value if floor_est and floor_est.kld else None,
        notes=notes,
    )
