"""Teacher-forced token log-probs against a direct log_softmax; stored floats round-trip float32."""

from __future__ import annotations

import pytest
import torch

from evals.engines.base import Failure, TokenLogprobs, TokenLogprobsRequest
from evals.engines.hf.engine import HFEngine
from evals.engines.hf.logprobs import shortest_floats
from tests.evals.hf_fixtures import PROMPTS


def test_token_logprobs_equal_direct_log_softmax(engine: HFEngine) -> None:
    text = "Once upon a time there was a small town by the river."
    res = engine.token_logprobs([TokenLogprobsRequest(text=text, top_k=5), TokenLogprobsRequest(text="x", top_k=5)])
    tl = res[0]
    assert isinstance(tl, TokenLogprobs) and isinstance(res[1], Failure)  # one token: nothing to predict
    ids = engine.tokenizer.encode(text)
    with torch.no_grad():
        lp = torch.log_softmax(engine.model(torch.tensor([ids])).logits[0].float(), dim=-1)
    assert tl.target_ids == ids[1:]
    assert len(tl.topk_ids) == len(tl.topk_logprobs) == len(ids) - 1
    for t in range(len(ids) - 1):
        assert tl.target_logprobs[t] == pytest.approx(float(lp[t, ids[t + 1]]), abs=1e-5)
        top = torch.topk(lp[t], 5)
        assert tl.topk_ids[t] == top.indices.tolist()
        assert tl.topk_logprobs[t] == pytest.approx(top.values.tolist(), abs=1e-5)
        assert tl.topk_logprobs[t] == sorted(tl.topk_logprobs[t], reverse=True)


def test_stored_floats_are_shortest_decimals_that_round_trip_float32() -> None:
    import numpy as np

    values = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 10
    out = shortest_floats(values)
    assert np.array_equal(np.asarray(out, dtype=np.float32), values.numpy())
    assert max(len(repr(v)) for v in out) <= 15  # float32 needs at most 9 significant digits
    assert shortest_floats(torch.tensor([0.1, -2.5])) == [0.1, -2.5]


def test_token_logprobs_cap_and_batch_independence(engine: HFEngine) -> None:
    long = " ".join([PROMPTS[1]] * 4)
    short = "The quick brown fox jumps"
    both = engine.token_logprobs([TokenLogprobsRequest(text=long, max_tokens=12), TokenLogprobsRequest(text=short)])
    alone = engine.token_logprobs([TokenLogprobsRequest(text=short)])[0]
    assert isinstance(both[0], TokenLogprobs) and len(both[0].target_ids) == 11
    assert isinstance(alone, TokenLogprobs) and isinstance(both[1], TokenLogprobs)
    assert alone.target_logprobs == pytest.approx(both[1].target_logprobs, abs=1e-5)
