"""HFModel: the cache seam (plain or quantized, chosen in one place) and logits read only where needed
(the split output layer against full forwards)."""

from __future__ import annotations

import math

import pytest

from evals.engines.base import (
    GenerateRequest,
    GenerateResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    TokenLogprobs,
    TokenLogprobsRequest,
)
from evals.engines.hf.engine import HFEngine
from tests.evals.hf_fixtures import PROMPTS, tiny_engine


def test_the_cache_class_follows_the_kv_spec(engine: HFEngine) -> None:
    from quant.kv.cache import QuantizedKVCache
    from quant.kv.plain import PlainKVCache

    assert isinstance(engine.hf.new_cache(), PlainKVCache)
    assert isinstance(tiny_engine({"kv": {"format": "nvfp4"}}).hf.new_cache(), QuantizedKVCache)
    assert engine.hf.rows_ok and engine.hf.drafts_ok


def test_kv_format_none_is_bit_identical_to_the_plain_cache(engine: HFEngine) -> None:
    none = tiny_engine({"kv": {"format": "none"}})
    reqs = [GenerateRequest(prompt=p, max_tokens=6) for p in PROMPTS]
    assert none.generate(reqs) == engine.generate(reqs)
    ll = [LoglikelihoodRequest("The quick brown fox", (" jumps", " over"))]
    assert none.loglikelihood(ll) == engine.loglikelihood(ll)
    tl = [TokenLogprobsRequest(text=PROMPTS[1])]
    assert none.token_logprobs(tl) == engine.token_logprobs(tl)


def test_nvfp4_cache_is_used_and_changes_scores(engine: HFEngine) -> None:
    q = tiny_engine({"kv": {"format": "nvfp4"}})
    tl = [TokenLogprobsRequest(text=" ".join(PROMPTS))]
    a, b = q.token_logprobs(tl)[0], engine.token_logprobs(tl)[0]
    assert isinstance(a, TokenLogprobs) and isinstance(b, TokenLogprobs)
    assert all(math.isfinite(v) for v in a.target_logprobs)
    assert a.target_logprobs != b.target_logprobs
    diff = max(abs(x - y) for x, y in zip(a.target_logprobs, b.target_logprobs, strict=True))
    assert diff < 5.0  # 4-bit KV perturbs, it does not destroy
    prefix = "Question: what is 2 + 3? Answer: 5.\n\n"
    mc = [LoglikelihoodRequest(prefix + "Question: a fox? Answer:", (" yes", " no", " maybe so"), prefix=prefix),
          LoglikelihoodRequest("The quick brown fox", (" jumps", "!"))]
    for res in q.loglikelihood(mc) + q.generate([GenerateRequest(prompt=prefix + "The town", prefix=prefix, max_tokens=4)]):
        assert isinstance(res, LoglikelihoodResult | GenerateResult)
        assert all(math.isfinite(v) for v in getattr(res, "loglikelihoods", ()))


def test_output_layer_on_read_rows_only_equals_full_logits(engine: HFEngine) -> None:
    """The split path (decoder, then the output layer on the rows read) against full forwards."""
    assert engine.hf.split_head  # a Llama: logits are lm_head(last hidden state)
    full = tiny_engine({"batch_size": 4})
    full.hf.split_head = False
    ll = [LoglikelihoodRequest("The quick brown fox", (" jumps", " over the lazy dog")),
          LoglikelihoodRequest("Once upon a time", (" there was",))]
    tl = [TokenLogprobsRequest(text=PROMPTS[1], top_k=3), TokenLogprobsRequest(text=PROMPTS[0], top_k=3)]
    for a, b in zip(engine.loglikelihood(ll), full.loglikelihood(ll), strict=True):
        assert isinstance(a, LoglikelihoodResult) and isinstance(b, LoglikelihoodResult)
        assert a.loglikelihoods == pytest.approx(b.loglikelihoods, abs=1e-5) and a.is_greedy == b.is_greedy
    for x, y in zip(engine.token_logprobs(tl), full.token_logprobs(tl), strict=True):
        assert isinstance(x, TokenLogprobs) and isinstance(y, TokenLogprobs)
        assert x.topk_ids == y.topk_ids
        assert x.target_logprobs == pytest.approx(y.target_logprobs, abs=1e-5)
