"""A reference answer scored given its prompt (TokenLogprobsRequest.context) by vLLM's real CPU engine and by
the hf engine on the same SmolLM2-135M folder: the same continuation tokens, the same log-probs (float32)
and the same top tokens, and KL(hf || vllm) over them at the float noise floor. Skips without vllm."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

from evals.engines import base as engine_base
from evals.engines import build_engine
from evals.engines.base import TokenLogprobs
from evals.engines.lmeval_tokens import encode_pair
from evals.engines.vllm.offline import VllmEngine
from evals.models.resolve import ResolvedModel
from tests.evals.hf_fixtures import smollm2_or_skip

pytestmark = pytest.mark.vllm

VLLM_ARGS = {"dtype": "float32", "max_model_len": 256, "enforce_eager": True, "max_num_seqs": 8}
# (prompt, reference continuation): a GSM8K-style answer, a multiple-choice gold choice, a prompt whose
# trailing space moves into the continuation (lm-eval's split), and a needle's value.
PAIRS = [
    ("Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer:",
     " Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"),
    ("Question: Which gas do plants absorb from the air?\nAnswer:", " carbon dioxide"),
    ("The special magic number for apple mentioned in the provided text is ", "4817263."),
]


@pytest.fixture(scope="module")
def model() -> ResolvedModel:
    return smollm2_or_skip()


@pytest.fixture(scope="module")
def both(model: ResolvedModel) -> Iterator[tuple[list[TokenLogprobs], list[TokenLogprobs], object]]:
    requests = [engine_base.TokenLogprobsRequest(text=t, context=c, top_k=5) for c, t in PAIRS]
    hf = build_engine("hf", model, {"dtype": "float32"})
    try:
        hf_out = hf.token_logprobs(requests)
        tokens = hf.hf.tokens  # type: ignore[attr-defined]
    finally:
        hf.close()
    vllm = build_engine("vllm", model, VLLM_ARGS)
    assert isinstance(vllm, VllmEngine)
    try:
        vllm_out = vllm.token_logprobs(requests)
    finally:
        vllm.close()
    assert all(isinstance(r, TokenLogprobs) for r in (*hf_out, *vllm_out))
    yield hf_out, vllm_out, tokens  # type: ignore[misc]


def test_vllm_and_hf_score_the_same_continuation_tokens(both) -> None:
    hf_out, vllm_out, tokens = both
    for (context, text), h, v in zip(PAIRS, hf_out, vllm_out, strict=True):
        _, cont = encode_pair(tokens, context, text)
        assert h.target_ids == v.target_ids == cont  # only the continuation's positions
        assert len(v.topk_ids) == len(cont)


def test_vllm_log_probs_equal_hf_on_the_same_tokens(both) -> None:
    from qa.compare.distribution import topk_kl

    hf_out, vllm_out, _ = both
    for h, v in zip(hf_out, vllm_out, strict=True):
        assert v.target_logprobs == pytest.approx(h.target_logprobs, abs=3e-3)
        assert [row[0] for row in v.topk_ids] == [row[0] for row in h.topk_ids]
        kl = topk_kl(np.asarray(h.topk_ids), np.asarray(h.topk_logprobs), np.asarray(v.topk_ids),
                     np.asarray(v.topk_logprobs))
        assert float(kl.mean()) < 1e-3  # the two engines' float32 noise, far below any fault's effect
