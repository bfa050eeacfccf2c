"""qa.compare.distribution: coarse-grained top-k KL vs exact KL, agreement, delta-p, log-PPL ratio, CR1 SEs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats
from scipy.special import log_softmax

from evals.engines.base import TokenLogprobs
from evals.records.samples import SampleRecord
from qa.compare.distribution import distribution_estimates, token_stats, topk_kl
from qa.compare.pairing import pair_records
from qa.errors import PairingError


def tl(logits: np.ndarray, targets: np.ndarray, k: int) -> TokenLogprobs:
    """TokenLogprobs from full logits (T, V): top-k sorted descending, target log-probs."""
    lp = log_softmax(logits, axis=-1)  # (T, V)
    order = np.argsort(-lp, axis=-1)[:, :k]  # (T, k)
    return TokenLogprobs(
        target_ids=targets.tolist(),
        target_logprobs=lp[np.arange(len(targets)), targets].tolist(),
        topk_ids=order.tolist(),
        topk_logprobs=np.take_along_axis(lp, order, axis=-1).tolist(),
    )


def test_full_vocab_topk_equals_exact_kl() -> None:
    rng = np.random.default_rng(0)
    base, cand = rng.normal(0, 2, (6, 12)), rng.normal(0, 2, (6, 12))
    targets = rng.integers(0, 12, 6)
    b, c = tl(base, targets, 12), tl(cand, targets, 12)
    got = token_stats(b, c).kld
    p, q = np.exp(log_softmax(base, -1)), np.exp(log_softmax(cand, -1))
    np.testing.assert_allclose(got, stats.entropy(p, q, axis=-1), rtol=1e-9, atol=1e-12)


def test_coarse_grained_kl_is_a_lower_bound() -> None:
    # Candidate gives its full distribution (k = V), so every baseline top-k token is found and the
    # coarse-graining is exact: data-processing inequality => coarse KL <= true KL.
    rng = np.random.default_rng(1)
    base, cand = rng.normal(0, 3, (50, 40)), rng.normal(0, 3, (50, 40))
    targets = rng.integers(0, 40, 50)
    coarse = token_stats(tl(base, targets, 5), tl(cand, targets, 40)).kld
    p, q = np.exp(log_softmax(base, -1)), np.exp(log_softmax(cand, -1))
    exact = stats.entropy(p, q, axis=-1)
    assert np.all(coarse <= exact + 1e-12)
    assert np.all(coarse >= 0)


def test_missing_token_imputation_hand_computed() -> None:
    # base top-2: token 1 (0.5), token 2 (0.3), tail 0.2. cand top-2: token 1 (0.6), token 3 (0.25),
    # tail 0.15. Token 2 missing from cand: q = min(k-th prob 0.25, tail 0.15 / 1 missing) = 0.15;
    # cand rest = 1 - 0.6 - 0.15 = 0.25.
    kl = topk_kl(np.array([[1, 2]]), np.log([[0.5, 0.3]]), np.array([[1, 3]]), np.log([[0.6, 0.25]]))
    want = 0.5 * math.log(0.5 / 0.6) + 0.3 * math.log(0.3 / 0.15) + 0.2 * math.log(0.2 / 0.25)
    assert kl[0] == pytest.approx(want)
    # two missing tokens share the tail: each gets min(0.25, 0.15 / 2) = 0.075
    kl2 = topk_kl(np.array([[1, 2, 4]]), np.log([[0.5, 0.2, 0.1]]), np.array([[1, 3, 5]]), np.log([[0.6, 0.15, 0.1]]))
    want2 = (0.5 * math.log(0.5 / 0.6) + 0.2 * math.log(0.2 / 0.075) + 0.1 * math.log(0.1 / 0.075)
             + 0.2 * math.log(0.2 / (1 - 0.6 - 0.15)))
    assert kl2[0] == pytest.approx(want2)


def test_token_stats_hand_values() -> None:
    b = TokenLogprobs(target_ids=[7, 8], target_logprobs=[math.log(0.5), math.log(0.2)],
                      topk_ids=[[7, 1], [3, 8]], topk_logprobs=[[math.log(0.5), math.log(0.3)], [math.log(0.6), math.log(0.2)]])
    c = TokenLogprobs(target_ids=[7, 8], target_logprobs=[math.log(0.4), math.log(0.4)],
                      topk_ids=[[7, 1], [8, 3]], topk_logprobs=[[math.log(0.4), math.log(0.3)], [math.log(0.4), math.log(0.3)]])
    ts = token_stats(b, c)
    np.testing.assert_allclose(ts.top1_agree, [1.0, 0.0])
    np.testing.assert_allclose(ts.delta_p, [-0.1, 0.2])
    np.testing.assert_allclose(ts.nll_diff, [math.log(0.5 / 0.4), math.log(0.2 / 0.4)])
    other = TokenLogprobs(target_ids=[7, 9], target_logprobs=[0.0, 0.0], topk_ids=[[7], [9]], topk_logprobs=[[0.0], [0.0]])
    with pytest.raises(PairingError, match="different target tokens"):
        token_stats(b, other)


def _records(arm: str, logits: list[np.ndarray], targets: list[np.ndarray], clusters: list[str], k: int):
    return [SampleRecord(task="wikitext_kl", task_version="1", arm=arm, item_id=f"chunk{i}", prompt_hash=f"h{i}",
                         cluster=clusters[i], token_logprobs=tl(lg, tg, k))
            for i, (lg, tg) in enumerate(zip(logits, targets, strict=True))]


def test_distribution_estimates_identical_arms_are_zero() -> None:
    rng = np.random.default_rng(2)
    logits = [rng.normal(0, 2, (20, 30)) for _ in range(4)]
    targets = [rng.integers(0, 30, 20) for _ in range(4)]
    cl = ["a", "a", "b", "c"]
    pt = pair_records(_records("b", logits, targets, cl, 8), _records("c", logits, targets, cl, 8))[0]
    est = {e.metric: e for e in distribution_estimates(pt)}
    assert set(est) == {"kld", "top1_agree", "delta_p", "log_ppl_ratio"}
    assert est["kld"].value == pytest.approx(0.0, abs=1e-12) and est["kld"].p99 == pytest.approx(0.0, abs=1e-12)
    assert est["top1_agree"].value == 1.0
    assert est["delta_p"].value == 0.0 and est["log_ppl_ratio"].value == 0.0
    assert est["kld"].n_tokens == 80 and est["kld"].n_chunks == 3
    assert [c.chunk for c in est["kld"].per_chunk] == ["chunk0", "chunk1", "chunk2", "chunk3"]


def test_distribution_se_is_cr1_by_chunk_and_matches_statsmodels() -> None:
    rng = np.random.default_rng(3)
    n_chunks, T, V = 8, 25, 16
    logits = [rng.normal(0, 2, (T, V)) for _ in range(n_chunks)]
    # candidate noise differs per chunk, so tokens within a chunk are correlated
    cand = [lg + rng.normal(0, 0.2 + 0.3 * (i % 3), (T, V)) for i, lg in enumerate(logits)]
    targets = [rng.integers(0, V, T) for _ in range(n_chunks)]
    cl = [f"doc{i}" for i in range(n_chunks)]
    pt = pair_records(_records("b", logits, targets, cl, V), _records("c", cand, targets, cl, V))[0]
    est = {e.metric: e for e in distribution_estimates(pt)}
    groups = np.repeat(np.arange(n_chunks), T)
    p = np.exp(log_softmax(np.concatenate(logits), -1))
    q = np.exp(log_softmax(np.concatenate(cand), -1))
    kl = stats.entropy(p, q, axis=-1)
    fit = sm.OLS(kl, np.ones((len(kl), 1))).fit(cov_type="cluster", cov_kwds={"groups": groups})
    assert est["kld"].value == pytest.approx(kl.mean())
    assert est["kld"].se == pytest.approx(fit.bse[0], rel=1e-8)
    assert est["kld"].se_naive == pytest.approx(stats.sem(kl))
    assert est["kld"].p99 == pytest.approx(np.percentile(kl, 99))
    tg = np.concatenate(targets)
    lp_b = log_softmax(np.concatenate(logits), -1)[np.arange(len(tg)), tg]
    lp_c = log_softmax(np.concatenate(cand), -1)[np.arange(len(tg)), tg]
    assert est["log_ppl_ratio"].value == pytest.approx(np.mean(lp_b - lp_c))
    assert est["delta_p"].value == pytest.approx(np.mean(np.exp(lp_c) - np.exp(lp_b)))
    assert est["kld"].per_chunk[2].value == pytest.approx(kl[2 * T:3 * T].mean())
