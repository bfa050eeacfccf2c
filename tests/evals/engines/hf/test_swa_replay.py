"""Bounded replay on models with sliding-window layers (evals.engines.hf.replay), tested against a cold
run on tiny Gemma-3 configs (window 6, blocks and passes of 6, so every replay pass has a cold pass's shape).

What the math says: the global layers read every hit position from the cache, so they equal the cold
run's; a sliding layer's replayed K/V depend on the layers before it, so they equal the cold run's
when no sliding layer precedes it (the first layer) and otherwise equal a pass whose sliding layers see
nothing below P - W (built here independently with transformers' own masks); with one sliding layer
first and W >= window - 1 the whole cache after a hit is the cold one, so warm == cold bit for bit,
with format none and with NVFP4 + an FP8 recent window alike."""

from __future__ import annotations

import pytest
import torch

from evals.engines.base import GenerateRequest, GenerateResult
from evals.engines.hf.args import parse_args
from evals.engines.hf.engine import HFEngine
from evals.engines.hf.replay import ShiftedLayer
from evals.errors import EngineError
from tests.tiny_models import tiny_gemma3, tiny_tokenizer

WINDOW = 6  # TINY_GEMMA3's sliding window
BLOCK = 6
P = 24  # the hit: the entry is a served prompt of 26 tokens cut to whole blocks
NVFP4_WINDOW = {"format": "nvfp4", "recent_window": 4, "recent_format": "fp8_e4m3"}
TWO_SLIDING = {"num_hidden_layers": 3, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]}


def gemma_engine(kv: dict, **overrides: object) -> HFEngine:
    tok = tiny_tokenizer()
    model = tiny_gemma3(vocab_size=len(tok), **overrides)
    return HFEngine(model, tok, parse_args({"prefill_chunk": BLOCK, "kv": kv}), "tiny-gemma3")


def token_ids(n: int = 40) -> list[int]:
    return torch.randint(2, 300, (n,), generator=torch.Generator().manual_seed(3)).tolist()


def warm_and_cold(engine: HFEngine, ids: list[int], first: int):  # -> (warm Served, cold Served)
    pc = engine.prefix_cache
    pc.reset()
    pc.serve(token_ids()[: P + 2], P + 1, P + 2)  # the entry (ids share its first P + 1 tokens)
    warm = pc.serve(ids, first, len(ids))
    pc.reset()
    return warm, pc.serve(ids, first, len(ids))


@pytest.mark.parametrize("kv", [{"format": "none"}, NVFP4_WINDOW], ids=["none", "nvfp4+fp8-window"])
def test_a_replay_of_one_window_equals_the_cold_run_bit_for_bit(kv: dict) -> None:
    engine = gemma_engine({**kv, "prefix_cache": {"block": BLOCK, "replay_window": WINDOW}})
    warm, cold = warm_and_cold(engine, token_ids(), 30)
    assert (warm.cached, cold.cached) == (P - WINDOW, 0)
    assert isinstance(warm.cache.layers[0], ShiftedLayer) and warm.cache.layers[0].offset == P - WINDOW
    assert torch.equal(warm.logits, cold.logits)
    for mine, theirs in zip(warm.cache.layers, cold.cache.layers, strict=True):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)


def test_nvfp4_replayed_positions_store_the_cold_runs_bytes() -> None:
    """The prompt ends right after the hit: the sliding layer's window holds replayed positions, whose
    NVFP4 / FP8 bytes and decode scales are those a cold prefill stores for them."""
    engine = gemma_engine({**NVFP4_WINDOW, "prefix_cache": {"block": BLOCK, "replay_window": WINDOW}})
    warm, cold = warm_and_cold(engine, token_ids(P + 1), P)
    assert warm.cached == P - WINDOW
    for layer in (0, 1):  # the sliding layer (replayed) and the global one (read from the cache)
        mine, theirs = warm.cache.layers[layer], cold.cache.layers[layer]
        for a, b in ((mine.k, theirs.k), (mine.v, theirs.v)):
            assert (a.main_len, a.recent_len) == (b.main_len, b.recent_len)
            (main, recent), (cold_main, cold_recent) = a.stored(), b.stored()
            assert recent is not None and cold_recent is not None and recent.format == "fp8_e4m3"
            assert torch.equal(recent.data["values"], cold_recent.data["values"])
            # sliding: 5 positions, the FP8 window's 4 and one NVFP4 one (re-quantized from FP8)
            assert main is not None and cold_main is not None and main.format == "nvfp4"
            assert all(torch.equal(t, cold_main.data[key]) for key, t in main.data.items())
            assert torch.equal(a.scale, b.scale) and torch.equal(a.recent_scale, b.recent_scale)


def test_later_sliding_layers_see_nothing_below_the_replay_window() -> None:
    """Two sliding layers: the second one's replayed K/V differ from the cold run's and equal a
    reference pass whose sliding masks hide positions below P - W from the replayed queries."""
    from transformers import DynamicCache

    engine = gemma_engine({"format": "none", "prefix_cache": {"block": BLOCK, "replay_window": WINDOW}},
                          **TWO_SLIDING)
    ids = token_ids(P + 1)
    warm, cold = warm_and_cold(engine, ids, P)
    q, k = torch.arange(P)[:, None], torch.arange(P)[None, :]
    causal = k <= q
    blind = causal & (k > q - WINDOW) & ((q < P - WINDOW) | (k >= P - WINDOW))  # [P, P] True = attend
    ref = DynamicCache(config=engine.model.config)
    with torch.no_grad():
        engine.model(input_ids=torch.tensor([ids[:P]]), cache=ref, use_cache=True,
                     attention_mask={"full_attention": causal[None, None], "sliding_attention": blind[None, None]})
    replayed = slice(0, WINDOW - 2)  # the window holds positions [P - 4, P]: [P - 4, P) were replayed
    for layer in (0, 1):
        mine = warm.cache.layers[layer].keys[..., replayed, :]
        assert torch.allclose(mine, ref.layers[layer].keys[..., -(WINDOW - 2):, :], rtol=0, atol=1e-6)
    assert torch.equal(warm.cache.layers[0].keys, cold.cache.layers[0].keys)  # the first layer: exact
    assert not torch.allclose(warm.cache.layers[1].keys[..., replayed, :], cold.cache.layers[1].keys[..., replayed, :])
    assert torch.equal(warm.cache.layers[2].keys[..., :P, :], cold.cache.layers[2].keys[..., :P, :])  # global


def test_without_replay_a_hit_is_a_whole_entry() -> None:
    engine = gemma_engine({"format": "none", "prefix_cache": {"block": BLOCK}})
    ids = token_ids()
    warm, cold = warm_and_cold(engine, ids, 30)
    assert (warm.cached, cold.cached) == (P, 0)
    assert torch.equal(warm.logits, cold.logits)
    pc = engine.prefix_cache
    pc.reset()
    pc.serve(ids[: P + 2], P + 1, P + 2)  # entry of P positions
    diverged = ids[:P - 3] + [(t % 297) + 2 for t in ids[P - 3:]]  # shares P - 3 positions: no whole entry
    assert pc.serve(diverged, 30, 31).cached == 0


def test_generation_through_the_prefix_cache_decodes_alone_warm_equal_to_cold() -> None:
    tok = tiny_tokenizer()
    engine = gemma_engine({"format": "none", "prefix_cache": {"block": BLOCK, "replay_window": WINDOW}})
    prompt = "Once upon a time there was a small town by the river, and the people"
    more = prompt + " there liked bread. Question: what is 2 + 3?"
    engine.generate([GenerateRequest(prompt=prompt, max_tokens=3)])
    warm = engine.generate([GenerateRequest(prompt=more, max_tokens=8)])[0]
    engine.reset_prefix_cache()
    cold = engine.generate([GenerateRequest(prompt=more, max_tokens=8)])[0]
    assert isinstance(warm, GenerateResult) and isinstance(cold, GenerateResult)
    hit = len(tok.encode(prompt)) // BLOCK * BLOCK
    assert warm.cached_tokens == hit - WINDOW > 0 and cold.cached_tokens == 0
    assert warm.text == cold.text and warm.output_tokens == cold.output_tokens == 8


def test_a_replay_window_larger_than_the_sliding_window_is_refused() -> None:
    with pytest.raises(EngineError, match="larger than the model's sliding window") as info:
        gemma_engine({"format": "none", "prefix_cache": {"block": BLOCK, "replay_window": WINDOW + 1}})
    assert "\n" not in str(info.value) and "replay_window 7" in str(info.value)
