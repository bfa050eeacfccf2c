"""The reference-answer statistics: hand-computed per-item delta log-prob and KL, repeats averaged before
items are weighed, CR1 over cluster keys (against statsmodels), "not available" and older records, the
comparison's `reference` list with its A/A floor, and real SmolLM2 on GSM8K: plain vs NVFP4 KV."""

from __future__ import annotations

import math

import numpy as np
import pytest
import statsmodels.api as sm

from evals.engines.base import TokenLogprobs
from evals.records.samples import SampleRecord
from qa.compare.arms import Arm, compare_arms
from qa.compare.pairing import pair_records
from qa.compare.reference import REFERENCE_ERROR_KEY, reference_estimate
from qa.files.comparison import StatsSettings

LN = math.log


def tl(probs: list[list[float]], ids: list[list[int]] | None = None, target: list[int] | None = None) -> TokenLogprobs:
    """TokenLogprobs from top-k probabilities per position (ids 1..k unless given; the target: ids[t][0])."""
    ids = ids or [list(range(1, len(p) + 1)) for p in probs]
    target = target or [row[0] for row in ids]
    lps = [[LN(p) for p in row] for row in probs]
    return TokenLogprobs(target_ids=target, target_logprobs=[row[0] for row in lps], topk_ids=ids, topk_logprobs=lps)


def rec(arm: str, item: str, ref: TokenLogprobs | None, *, repeat: int = 0, cluster: str | None = None,
        meta: dict | None = None, score: float = 0.0) -> SampleRecord:
    return SampleRecord(task="gsm8k", task_version="1", arm=arm, item_id=item, repeat=repeat, cluster=cluster,
                        prompt_hash="h" + item, scores={"exact_match,strict-match": score}, reference_logprobs=ref,
                        meta=meta or {})


def estimate(base: list[SampleRecord], cand: list[SampleRecord]):  # -> ReferenceEstimate | None
    [pt] = pair_records(base, cand)
    return reference_estimate(pt)


def test_one_item_by_hand() -> None:
    # position 1: base (0.5, 0.3) + tail 0.2, cand (0.4, 0.4) + tail 0.2; position 2: identical (0.9, 0.05)
    b = tl([[0.5, 0.3], [0.9, 0.05]])
    c = tl([[0.4, 0.4], [0.9, 0.05]])
    est = estimate([rec("b", "q1", b), rec("b", "q2", b)], [rec("c", "q1", c), rec("c", "q2", b)])
    kl1 = 0.5 * LN(0.5 / 0.4) + 0.3 * LN(0.3 / 0.4)  # the tail buckets are equal
    assert est is not None and est.n == 2 and est.n_tokens == 4 and est.n_missing == 0
    assert est.kld is not None and est.kld.value == pytest.approx((kl1 / 2 + 0.0) / 2, rel=1e-9)
    delta_q1 = (LN(0.4) - LN(0.5)) / 2  # mean over q1's 2 tokens; q2 unchanged
    assert est.delta_logprob is not None and est.delta_logprob.value == pytest.approx(delta_q1 / 2, rel=1e-9)
    assert est.mean_logprob_baseline == pytest.approx((LN(0.5) + LN(0.9)) / 2)
    assert est.kld_max == pytest.approx(kl1, rel=1e-9)
    # two items, each its own cluster: the SE is the sd of the two item values / sqrt(2), df 1
    assert est.delta_logprob.se == pytest.approx(abs(delta_q1) / 2, rel=1e-9) and est.delta_logprob.df == 1


def test_repeats_are_averaged_before_items_are_weighed() -> None:
    same, worse = tl([[0.5]]), tl([[0.25]])
    base = [rec("b", "q1", same, repeat=0), rec("b", "q1", same, repeat=1), rec("b", "q2", same)]
    cand = [rec("c", "q1", worse, repeat=0), rec("c", "q1", same, repeat=1), rec("c", "q2", same)]
    est = estimate(base, cand)
    assert est is not None and est.n == 2  # items, not samples
    # q1: the mean of its repeats (ln 0.25 - ln 0.5, 0); then q1 and q2 weigh the same (not 1/3 per sample)
    assert est.delta_logprob.value == pytest.approx(((LN(0.25) - LN(0.5)) / 2) / 2, rel=1e-9)


def test_items_sharing_a_cluster_key_get_the_cr1_se_of_statsmodels() -> None:
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(6), 3)  # 6 clusters of 3 items
    probs = rng.uniform(0.2, 0.8, size=len(groups))
    base = [rec("b", f"q{i}", tl([[0.5]]), cluster=f"g{g}") for i, g in enumerate(groups)]
    cand = [rec("c", f"q{i}", tl([[p]]), cluster=f"g{g}") for i, (p, g) in enumerate(zip(probs, groups, strict=True))]
    est = estimate(base, cand)
    x = np.log(probs) - LN(0.5)
    fit = sm.OLS(x, np.ones((len(x), 1))).fit(cov_type="cluster", cov_kwds={"groups": groups, "use_correction": False})
    g = 6
    assert est is not None and est.n_clusters == 6 and est.delta_logprob.df == 5
    assert est.delta_logprob.value == pytest.approx(float(np.mean(x)))
    cr1 = float(fit.bse[0]) * math.sqrt(g / (g - 1))  # floored at the item-level SE (qa.stats.basic.gate_mean_se)
    assert est.delta_logprob.se == pytest.approx(max(cr1, float(np.std(x, ddof=1) / math.sqrt(len(x)))), rel=1e-9)


def test_not_available_older_records_and_mismatched_tokens() -> None:
    na = {REFERENCE_ERROR_KEY: "not available: the server does not echo prompt log-probs"}
    b = tl([[0.5]])
    est = estimate([rec("b", "q1", b)], [rec("c", "q1", None, meta=na)])
    assert est is not None and est.n == 0 and est.unavailable == na[REFERENCE_ERROR_KEY] and est.delta_logprob is None
    assert estimate([rec("b", "q1", None)], [rec("c", "q1", None)]) is None  # written before the field: nothing
    other = tl([[0.5]], target=[7])
    est = estimate([rec("b", "q1", b), rec("b", "q2", b), rec("b", "q3", b)],
                   [rec("c", "q1", other), rec("c", "q2", b), rec("c", "q3", None)])
    assert est is not None and est.n == 1 and est.n_missing == 1 and any("different reference tokens" in n for n in est.notes)


def test_the_comparison_lists_it_with_the_aa_floor_and_old_records_compare_as_before() -> None:
    b, c = tl([[0.5, 0.3]]), tl([[0.4, 0.4]])
    base = [rec("b", f"q{i}", b) for i in range(4)]
    cand = [rec("c", f"q{i}", c) for i in range(4)]
    rerun = [rec("r", f"q{i}", b) for i in range(4)]
    settings = StatsSettings(bootstrap_n=0)
    comp = compare_arms(Arm("b", "records", tuple(base)), Arm("c", "records", tuple(cand)), settings,
                        rerun=Arm("r", "records", tuple(rerun)))
    [ref] = comp.reference
    assert ref.task == "gsm8k" and ref.kld is not None and ref.kld.value > 0
    assert ref.floor_kld == 0.0 and ref.floor_delta_logprob == 0.0
    old = compare_arms(Arm("b", "records", tuple(r.model_copy(update={"reference_logprobs": None}) for r in base)),
                       Arm("c", "records", tuple(r.model_copy(update={"reference_logprobs": None}) for r in cand)), settings)
    assert old.reference == [] and old.estimates == compare_arms(Arm("b", "records", tuple(base)),
                                                                 Arm("c", "records", tuple(cand)), settings).estimates


# ----------------------------------------------------------------------------- real SmolLM2


def test_smollm2_gsm8k_plain_vs_nvfp4_kv_has_a_nonzero_kl() -> None:
    from evals.engines import build_engine
    from evals.run.reference import chunk_references
    from evals.run.selection import select_items
    from evals.tasks import get_task
    from evals.tasks.base import TaskOptions
    from tests.evals.hf_fixtures import smollm2_or_skip
    from tests.shared_data import shared_data_dir

    model = smollm2_or_skip()
    task = get_task("gsm8k", TaskOptions(num_fewshot=0))  # short prompts: the test stays a few seconds
    items = select_items(task.items(shared_data_dir("gsm8k")), 3, 1234)
    pairs = [(it, task.request(it, repeat=0, seed=0)) for it in items]
    out = {}
    for arm, args in (("plain", {"dtype": "float32"}), ("again", {"dtype": "float32", "batch_size": 1}),
                      ("nvfp4", {"dtype": "float32", "kv": {"format": "nvfp4", "scales": "dynamic"}})):
        engine = build_engine("hf", model, args)
        try:
            refs = chunk_references(engine, task, pairs)
        finally:
            engine.close()
        out[arm] = [rec(arm, it.item_id, r) for it, r in zip(items, refs, strict=True)]  # type: ignore[arg-type]
    est = estimate(out["plain"], out["nvfp4"])
    aa = estimate(out["plain"], out["again"])
    assert est is not None and est.n == 3 and est.n_tokens > 60
    assert est.kld is not None and est.kld.value > 1e-4 and est.kld_p99 is not None and est.kld_p99 > 0
    assert est.delta_logprob is not None and est.delta_logprob.value != 0
    assert aa is not None and aa.kld is not None and aa.kld.value < est.kld.value / 10
