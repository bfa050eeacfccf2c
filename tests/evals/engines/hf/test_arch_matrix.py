"""The hf engine on every family of the KV architecture matrix (docs/KV_ARCHITECTURES.md): tiny random
models built here around the tiny tokenizer; with kv format none the engine's generations and log-probs
equal those of the engine without a kv spec, NVFP4 runs and changes them, and a spec the model cannot
take fails at build time in one line (EngineError, exit 2 in the CLI)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from evals.engines.base import GenerateRequest, LoglikelihoodRequest, TokenLogprobsRequest
from evals.engines.hf.surgery import split_head
from tests.evals.hf_fixtures import PROMPTS
from tests.tiny_models import TINY_FAMILIES, tiny_family, tiny_tokenizer

torch.set_num_threads(1)


def _engine(model: Any, tok: Any, args: dict[str, Any]) -> Any:  # -> HFEngine
    from evals.engines.hf.args import parse_args
    from evals.engines.hf.engine import HFEngine

    return HFEngine(model, tok, parse_args(args), "tiny")


@pytest.mark.parametrize("name", tuple(TINY_FAMILIES))
def test_the_engine_runs_every_family_with_format_none_identical_to_no_kv_spec(name: str) -> None:
    tok = tiny_tokenizer()
    model = tiny_family(name, vocab_size=len(tok), bos_token_id=0, eos_token_id=1, pad_token_id=1)
    if split_head(model)[0] is not None:  # the split output layer gives the model's own logits
        ids = tok(PROMPTS[1], return_tensors="pt").input_ids
        decoder, head = split_head(model)
        with torch.no_grad():
            logits = head(decoder(input_ids=ids).last_hidden_state)
            cap = getattr(model.config, "final_logit_softcapping", None)
            logits = torch.tanh(logits / cap) * cap if cap else logits
            assert torch.equal(logits, model(input_ids=ids).logits)
    reqs = [GenerateRequest(prompt=p, max_tokens=4) for p in PROMPTS]
    ll = [LoglikelihoodRequest("The quick brown fox", (" jumps", " over"))]
    tl = [TokenLogprobsRequest(text=PROMPTS[1])]
    plain, none, nvfp4 = (_engine(model, tok, args) for args in ({}, {"kv": {"format": "none"}},
                                                                   {"kv": {"format": "nvfp4"}}))
    assert none.generate(reqs) == plain.generate(reqs)
    assert none.loglikelihood(ll) == plain.loglikelihood(ll)
    assert none.token_logprobs(tl) == plain.token_logprobs(tl)
    quantized = nvfp4.token_logprobs(tl)[0].target_logprobs
    assert all(math.isfinite(v) for v in quantized) and quantized != plain.token_logprobs(tl)[0].target_logprobs
    assert len(nvfp4.generate(reqs)) == len(reqs)


def test_build_refuses_a_profile_the_model_cannot_take_in_one_line(tmp_path: Path) -> None:
    """gpt_oss adds attention sinks, which the flashinfer-nvfp4 profile's attention function would drop."""
    from evals.engines.hf import build
    from evals.engines.hf.args import parse_args
    from evals.errors import EngineError
    from evals.models.resolve import ResolvedModel

    tok = tiny_tokenizer()
    tiny_family("gpt_oss", vocab_size=len(tok)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model = ResolvedModel(name="tiny-gpt-oss", path=tmp_path, hub_id=None, file_hash=None)
    with pytest.raises(EngineError, match="attends with learned sinks") as err:
        build(model, parse_args({"kv": {"format": "nvfp4", "profile": "flashinfer-nvfp4"}}))
    assert "\n" not in str(err.value)
