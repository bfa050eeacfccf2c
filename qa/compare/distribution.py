"""Teacher-forced distribution checks between arms (e.g. WikiText-2 chunks): KL(base || cand),
top-1 agreement, change in the actual next token's probability, log-perplexity ratio.

Each record's `token_logprobs` holds, per position, the arm's own top-k ids and log-probs and the
log-prob of the actual next token. All statistics are token-weighted means with SEs clustered by
text chunk (the record's cluster key, else its item id; CR1, G - 1 df): tokens of one chunk are
not independent, and naive per-token SEs (llama.cpp `perplexity --kl-divergence`) can be >10x
too small. Sign convention: candidate - baseline (delta_p < 0 and log_ppl_ratio > 0: worse).

KL over top-k (coarse-graining): both distributions are mapped onto {baseline's top-k tokens} +
one tail bucket (tail = 1 - sum of the k probabilities). The candidate's probability of a baseline
top-k token that is missing from the candidate's own top-k is unknown, but it is at most the
candidate's k-th probability, and all missing tokens together hold at most the candidate's tail
mass: we use min(candidate k-th prob, candidate tail / number of missing tokens). By the
data-processing inequality the coarse-grained KL is a lower bound of the true KL (exactly so when
the baseline's top-k are all in the candidate's top-k; otherwise up to that imputation).
Sources: Dutta et al., "Accuracy is Not All You Need" (arXiv 2407.09141); llama.cpp perplexity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from evals.engines.base import TokenLogprobs
from qa.compare.pairing import PairedTask
from qa.errors import PairingError
from qa.files.comparison import ChunkValue, DistributionEstimate, DistributionMetric
from qa.stats.basic import gate_mean_se, t_interval

_P_FLOOR = 1e-12  # probabilities below this are treated as this (keeps log(p/q) finite)


@dataclass(frozen=True)
class TokenStats:
    """Per-position statistics of one chunk, each (T,) float64 (T = scored positions)."""

    kld: np.ndarray
    top1_agree: np.ndarray
    delta_p: np.ndarray
    nll_diff: np.ndarray  # NLL_cand - NLL_base = base logprob - cand logprob


def topk_kl(base_ids: np.ndarray, base_lp: np.ndarray, cand_ids: np.ndarray, cand_lp: np.ndarray) -> np.ndarray:
    """Coarse-grained KL(base || cand) per position over {base top-k} + tail, nats.
    Inputs (T, k): ids and natural-log probs, each row descending. Returns (T,)."""
    p = np.exp(base_lp)  # (T, k)
    q_top = np.exp(cand_lp)  # (T, k)
    p_tail = np.clip(1.0 - p.sum(axis=1), 0.0, 1.0)  # (T,)
    q_tail = np.clip(1.0 - q_top.sum(axis=1), 0.0, 1.0)  # (T,)
    match = base_ids[:, :, None] == cand_ids[:, None, :]  # (T, k_base, k_cand)
    found = match.any(axis=2)  # (T, k)
    q_found = np.where(match, q_top[:, None, :], 0.0).sum(axis=2)  # (T, k)
    n_missing = (~found).sum(axis=1)  # (T,)
    spread = q_tail / np.maximum(n_missing, 1)  # (T,)
    q_kth = q_top.min(axis=1)  # (T,)
    q_missing = np.minimum(q_kth, spread)  # (T,) the bound described in the module docstring
    q = np.where(found, q_found, q_missing[:, None])  # (T, k)
    q_rest = np.clip(1.0 - q.sum(axis=1), 0.0, 1.0)  # (T,) candidate mass outside base top-k
    p_c, q_c = np.maximum(p, _P_FLOOR), np.maximum(q, _P_FLOOR)
    kl = (p * (np.log(p_c) - np.log(q_c))).sum(axis=1)  # (T,)
    tail = np.where(p_tail > 0, p_tail * (np.log(np.maximum(p_tail, _P_FLOOR)) - np.log(np.maximum(q_rest, _P_FLOOR))), 0.0)
    return np.maximum(kl + tail, 0.0)


def token_stats(base: TokenLogprobs, cand: TokenLogprobs) -> TokenStats:
    """Per-position statistics of one chunk; both arms must score the same target tokens."""
    if base.target_ids != cand.target_ids:
        raise PairingError("token_logprobs: the arms scored different target tokens; use the same tokenizer and text")
    T = len(base.target_ids)
    b_ids = np.asarray(base.topk_ids, dtype=np.int64).reshape(T, -1)  # (T, k_b)
    c_ids = np.asarray(cand.topk_ids, dtype=np.int64).reshape(T, -1)  # (T, k_c)
    b_lp = np.asarray(base.topk_logprobs, dtype=np.float64).reshape(T, -1)
    c_lp = np.asarray(cand.topk_logprobs, dtype=np.float64).reshape(T, -1)
    b_t = np.asarray(base.target_logprobs, dtype=np.float64)  # (T,)
    c_t = np.asarray(cand.target_logprobs, dtype=np.float64)
    return TokenStats(
        kld=topk_kl(b_ids, b_lp, c_ids, c_lp),
        top1_agree=(b_ids[:, 0] == c_ids[:, 0]).astype(np.float64),
        delta_p=np.exp(c_t) - np.exp(b_t),
        nll_diff=b_t - c_t,
    )


def _estimate(
    task: str, metric: DistributionMetric, x: np.ndarray, groups: np.ndarray, chunks: Sequence[tuple[str, int, int]]
) -> DistributionEstimate:
    """Token-weighted mean of x (N,) with CR1 SE over `groups` (N,) ints (never below the token-level SE:
    qa.stats.basic.gate_mean_se); per-chunk means."""
    value, se, df, _ = gate_mean_se(x, groups)
    se_naive = float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) > 1 else None
    ci = t_interval(value, se, df, 0.95) if se is not None else None
    per_chunk = [ChunkValue(chunk=name, n_tokens=hi - lo, value=float(np.mean(x[lo:hi]))) for name, lo, hi in chunks if hi > lo]
    extra = {}
    if metric == "kld":
        extra = {"p99": float(np.percentile(x, 99)), "p999": float(np.percentile(x, 99.9)), "max": float(np.max(x))}
    notes = ["SE clustered by chunk (CR1); se_naive treats tokens as independent"]
    return DistributionEstimate(task=task, metric=metric, n_tokens=len(x), n_chunks=len(np.unique(groups)),
                                value=value, se=se, se_naive=se_naive, ci95=ci, per_chunk=per_chunk,
                                notes=notes, **extra)


def has_token_logprobs(pt: PairedTask) -> bool:
    """True when the task's records carry teacher-forced token log-probs."""
    return any(r.token_logprobs is not None for r in pt.baseline)


def distribution_estimates(pt: PairedTask) -> list[DistributionEstimate]:
    """kld, top1_agree, delta_p and log_ppl_ratio of one paired task (empty without token log-probs)."""
    parts: list[TokenStats] = []
    chunks: list[tuple[str, int, int]] = []  # (chunk name, start, end) into the token arrays
    group_ids: list[np.ndarray] = []
    cluster_index: dict[str, int] = {}
    start = skipped = 0
    for rb, rc in zip(pt.baseline, pt.candidate, strict=True):
        if rb.token_logprobs is None or rc.token_logprobs is None:
            skipped += 1
            continue
        ts = token_stats(rb.token_logprobs, rc.token_logprobs)
        T = len(ts.kld)
        key = rb.cluster if rb.cluster is not None else f"item:{rb.item_id}"
        g = cluster_index.setdefault(key, len(cluster_index))
        parts.append(ts)
        group_ids.append(np.full(T, g, dtype=np.int64))
        name = rb.item_id if rb.repeat == 0 else f"{rb.item_id}#{rb.repeat}"
        chunks.append((name, start, start + T))
        start += T
    if not parts or start == 0:
        return []
    groups = np.concatenate(group_ids)  # (N,)
    out = []
    for metric, attr in (("kld", "kld"), ("top1_agree", "top1_agree"), ("delta_p", "delta_p"),
                         ("log_ppl_ratio", "nll_diff")):
        x = np.concatenate([getattr(p, attr) for p in parts])  # (N,)
        est = _estimate(pt.task, metric, x, groups, chunks)  # type: ignore[arg-type]
        if skipped:
            est = est.model_copy(update={"notes": [*est.notes, f"{skipped} samples without token log-probs in an arm were skipped"]})
        out.append(est)
    return out
