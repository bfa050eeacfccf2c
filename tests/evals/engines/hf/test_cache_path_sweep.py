"""Warm == cold wherever the math says so, swept over geometries: an FP8 recent window smaller
than, equal to and larger than a prefix-cache block, hits at an entry's end and inside it, and on a
sliding-window model every replay window from 0 to the sliding window.

Passes are one block (`prefill_chunk` = `block`), so after a hit every pass has a cold pass's shape.
- Full attention (tiny Llama): a hit restores the cache the cold prefill held at the hit, FP8 window
  included, so warm == cold bit for bit for every window and block. Replay is refused there.
- Tiny Gemma-3 (a sliding layer of window 6 first, a global one second), hit P = 24: replay 0 reads a
  whole entry, and a replay of 6 over blocks of 6 recomputes [18, 24) in the cold run's own pass: warm ==
  cold bit for bit. A replay W restarts the sliding layer empty at P - W (`evals.engines.hf.replay`), so:
  - W <= 4 (< window - 1 = 5): by design the sliding attention of the queries [P, P + 5 - W) sees only the
    W positions [P - W, P) below the hit where a cold run sees 5. Warm equals a cold run of the same
    passes whose sliding mask hides everything below P - W from the queries at P and after (built here
    with transformers' own masks, no prefix cache, no replay machinery; measured: 0 with NVFP4, at most
    2.4e-7 in the logits and 1.2e-6 in K/V with format none, the replay's pass having W rows where the
    cold one has a block's), and its cache differs from the cold one exactly at the global layer's
    positions [P, P + 5 - W), those queries' outputs (by 1.05 or more; elsewhere 0 with NVFP4).
  - W = 5 or 6 over blocks of 4, and 5 over blocks of 6: the sliding layer holds all a cold run holds, but
    the replay's passes ([19, 23), [23, 24) for W = 5 over 4) are not the cold run's ([16, 20), [20, 24)):
    not promised bit for bit. The bounds asserted are measured here (CPU, float32, torch 2.13): float
    rounding of passes of other shapes, at most 1.3e-6 in K/V and 1.8e-7 in the logits with format none,
    0 with NVFP4 (the rounding does not move a code); with an FP8 window of 2 over blocks of 4 a replayed
    position reaches NVFP4 by another path than in the cold run (W = 5: position 19 straight from its
    value where the cold run re-quantizes it from FP8, 21 the other way round), 4.2e-3 (W = 5) and 7.0e-3
    (W = 6) in the logits, against 1.6e-2 to 0.12 where the design changes what a query sees (W <= 4).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from evals.engines.hf.args import parse_args
from evals.engines.hf.engine import HFEngine
from evals.engines.hf.prefix_cache import Served, chunk_bounds
from evals.engines.hf.replay import ShiftedLayer
from evals.errors import EngineError
from tests.tiny_models import tiny_gemma3, tiny_model, tiny_tokenizer

BLOCK = 4
SLIDING = 6  # TINY_GEMMA3's sliding window: a sliding layer keeps 5 positions below a new one
ENTRY = 26  # the cached prompt's length: an entry of 24 positions (whole blocks of 4 and of 6)
HIT = 24  # a prompt extending the entry hits its 24 positions
FIRST = 30  # the first position whose logits the Gemma-3 prompt asks for
GEMMA_KV = {  # (format, FP8 window)
    "none": ("none", 0), "nvfp4": ("nvfp4", 0), "nvfp4+fp8-2": ("nvfp4", 2), "nvfp4+fp8-8": ("nvfp4", 8),
}
FLOAT_LOGITS = 1e-6  # format none's float rounding: measured at most 2.4e-7 in the logits here
FLOAT_KV = 5e-6  # and at most 1.3e-6 in K/V
OTHER_PATH_LOGITS = 1.5e-2  # FP8 window 2, W = 5 or 6 over blocks of 4: measured 4.2e-3 and 7.0e-3


def engine_for(model_kind: str, window: int, replay: int = 0, fmt: str = "nvfp4", block: int = BLOCK) -> HFEngine:
    """An engine on a tiny model whose prefix cache has blocks of `block` and prefills in passes of one block."""
    kv: dict = {"format": fmt, "prefix_cache": {"block": block, "replay_window": replay}}
    if window:
        kv.update(recent_window=window, recent_format="fp8_e4m3")
    args = parse_args({"prefill_chunk": block, "kv": kv})
    tok = tiny_tokenizer()
    model = tiny_model(len(tok)) if model_kind == "llama" else tiny_gemma3(vocab_size=len(tok))
    return HFEngine(model, tok, args, f"tiny-{model_kind}")


def gemma_engine(kv: str, replay: int, block: int) -> HFEngine:
    fmt, window = GEMMA_KV[kv]
    return engine_for("gemma3", window, replay, fmt=fmt, block=block)


def ids(n: int = 40, seed: int = 3) -> list[int]:
    return torch.randint(2, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def warm_and_cold(engine: HFEngine, entry: list[int], prompt: list[int], first: int) -> tuple[Served, Served]:
    """The prompt served after `entry` was (warm), then alone after a reset (cold)."""
    pc = engine.prefix_cache
    pc.reset()
    pc.serve(entry, len(entry) - 1, len(entry))
    warm = pc.serve(prompt, first, len(prompt))
    pc.reset()
    return warm, pc.serve(prompt, first, len(prompt))


def same_cache(warm: Any, cold: Any) -> bool:
    return all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(warm.layers, cold.layers, strict=True))


def kv_gap(mine: Any, theirs: Any) -> torch.Tensor:
    """max |mine - theirs| over K and V of one layer, per position [T]."""
    return torch.maximum((mine.keys - theirs.keys).abs().amax(dim=(0, 1, 3)),
                         (mine.values - theirs.values).abs().amax(dim=(0, 1, 3)))


def blind_cold(engine: HFEngine, prompt: list[int], replay: int) -> tuple[torch.Tensor, Any]:
    """(logits at [FIRST, len(prompt)), cache) of a cold run in the engine's own passes and cache format whose
    sliding attention hides every position below HIT - replay from the queries at HIT and after (transformers'
    masks): what the design says a warm run with that replay computes."""
    hf = engine.prefix_cache.hf
    block = hf.args.prefill_chunk
    cache = hf.new_cache()
    x = torch.tensor([prompt])
    logits = []
    with torch.inference_mode():
        for a, b in chunk_bounds(0, len(prompt), block, (len(prompt) // block * block,)):
            q = torch.arange(a, b)[:, None]  # [pass, 1] absolute query positions
            masks = {}
            for name, layer in (("sliding_attention", cache.layers[0]), ("full_attention", cache.layers[1])):
                kv_length, kv_offset = layer.get_mask_sizes(b - a)
                k = torch.arange(kv_offset, kv_offset + kv_length)[None, :]  # [1, keys] absolute key positions
                seen = k <= q
                if name == "sliding_attention":
                    seen &= (k > q - SLIDING) & ((q < HIT) | (k >= HIT - replay))
                masks[name] = seen[None, None]  # [1, 1, pass, keys]
            pos = torch.arange(a, b)[None, :]
            if b > FIRST:  # the rows the prefix cache's pass computes logits for: [max(a, FIRST), b)
                lo = max(a, FIRST)
                logits.append(hf.span_logits(x[:, a:b], [(0, lo - a, b - lo)], cache=cache, position_ids=pos,
                                             attention_mask=masks)[0])  # type: ignore[arg-type]
            else:
                hf.forward(x[:, a:b], cache=cache, attention_mask=masks, position_ids=pos,  # type: ignore[arg-type]
                           logits_to_keep=1)
    return torch.cat(logits), cache


# ---- full attention ----

@pytest.mark.parametrize(("fmt", "window"), [("none", 0), ("nvfp4", 0), ("nvfp4", 2), ("nvfp4", 4), ("nvfp4", 8)],
                         ids=["none", "nvfp4", "nvfp4+fp8-2", "nvfp4+fp8-4", "nvfp4+fp8-8"])
@pytest.mark.parametrize("block", [4, 6])
@pytest.mark.parametrize("shared", [ENTRY, 13], ids=["hit-at-entry-end", "hit-inside-entry"])
def test_full_attention_warm_equals_cold_bit_for_bit(fmt: str, window: int, block: int, shared: int) -> None:
    """FP8 windows of 2 (< both blocks), 4 (= a block of 4, < one of 6) and 8 (> both)."""
    engine = engine_for("llama", window, fmt=fmt, block=block)
    entry = ids()[:ENTRY]
    prompt = ids()[:shared] + ids(seed=5)[: 40 - shared]  # shares `shared` positions with the entry
    warm, cold = warm_and_cold(engine, entry, prompt, 34)
    assert (warm.cached, cold.cached) == (min(shared, HIT) // block * block, 0)
    assert warm.cached > 0
    assert torch.equal(warm.logits, cold.logits)
    assert same_cache(warm.cache, cold.cache)


def test_replay_on_full_attention_is_refused_in_one_line() -> None:
    with pytest.raises(EngineError, match="replay_window 4 needs a model with sliding-window layers") as info:
        engine_for("llama", 8, replay=4)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("window", [2, 8], ids=["window-2<block", "window-8>block"])
def test_a_hit_inside_an_entry_restores_the_fp8_window_a_cold_prefill_ends_with(window: int) -> None:
    """The entry's FP8 window moved past the hit; the positions a cold prefill of the hit still holds in
    FP8 come back in those FP8 bytes, not re-quantized to NVFP4."""
    engine = engine_for("llama", window)
    pc = engine.prefix_cache
    entry = ids()[:ENTRY]
    pc.serve(entry, ENTRY - 1, ENTRY)
    cache, read, hit = pc.lookup(entry[:12] + ids(seed=5)[:10], 12)
    assert read == hit == 12
    pc.reset()
    cold = pc.serve(entry[:12], 11, 12).cache  # a cold prefill of the hit's 12 positions
    for mine, theirs in zip(cache.layers, cold.layers, strict=True):
        for a, b in ((mine.k, theirs.k), (mine.v, theirs.v)):
            assert (a.main_len, a.recent_len) == (b.main_len, b.recent_len) == (12 - window, window)
            (main, recent), (cold_main, cold_recent) = a.stored(), b.stored()
            assert recent is not None and cold_recent is not None
            assert torch.equal(recent.data["values"], cold_recent.data["values"])
            assert main is not None and cold_main is not None
            assert all(torch.equal(t, cold_main.data[key]) for key, t in main.data.items())
            assert torch.equal(a.view(), b.view())


# ---- sliding window (tiny Gemma-3) ----

@pytest.mark.parametrize("kv", list(GEMMA_KV))
@pytest.mark.parametrize(("block", "replay"), [(4, 0), (6, 0), (6, 6)])
def test_no_replay_or_one_window_replayed_in_the_cold_runs_pass_equals_cold_bit_for_bit(kv: str, block: int,
                                                                                         replay: int) -> None:
    warm, cold = warm_and_cold(gemma_engine(kv, replay, block), ids()[:ENTRY], ids(), FIRST)
    assert (warm.cached, cold.cached) == (HIT - replay, 0)
    assert torch.equal(warm.logits, cold.logits)
    assert same_cache(warm.cache, cold.cache)


@pytest.mark.parametrize("kv", list(GEMMA_KV))
@pytest.mark.parametrize("block", [4, 6])
@pytest.mark.parametrize("replay", [1, 2, 3, 4])
def test_a_replay_shorter_than_the_window_hides_the_positions_below_it_as_designed(kv: str, block: int,
                                                                                   replay: int) -> None:
    """The sliding layer restarts empty at P - W; warm equals `blind_cold` within float rounding (module
    docstring) and differs from cold exactly at the global positions whose queries saw fewer keys."""
    engine = gemma_engine(kv, replay, block)
    entry, prompt = ids()[:ENTRY], ids()  # the prompt extends the entry
    pc = engine.prefix_cache
    pc.serve(entry, ENTRY - 1, ENTRY)
    restored, read, hit = pc.lookup(prompt, FIRST)
    assert (read, hit) == (HIT - replay, HIT)
    sliding = restored.layers[0]  # restarted empty at P - W: the replay writes exactly W positions below the hit
    assert isinstance(sliding, ShiftedLayer) and sliding.offset == HIT - replay
    assert sliding.inner.get_seq_length() == 0 and restored.layers[1].get_seq_length() == HIT

    warm, cold = warm_and_cold(engine, entry, prompt, FIRST)
    ref_logits, ref_cache = blind_cold(engine, prompt, replay)
    assert torch.allclose(warm.logits, ref_logits, rtol=0, atol=FLOAT_LOGITS)
    for mine, theirs in zip(warm.cache.layers, ref_cache.layers, strict=True):
        assert torch.allclose(mine.keys, theirs.keys, rtol=0, atol=FLOAT_KV)
        assert torch.allclose(mine.values, theirs.values, rtol=0, atol=FLOAT_KV)

    gap = kv_gap(warm.cache.layers[1], cold.cache.layers[1])  # the global layer, per position
    seen_less = slice(HIT, HIT + SLIDING - 1 - replay)  # queries whose sliding window reached below P - W
    assert bool((gap[seen_less] > 0.1).all())  # measured 1.05 to 3.2 per position
    gap[seen_less] = 0
    exact = GEMMA_KV[kv][0] != "none"  # NVFP4: every other position bit for bit; none: float rounding
    assert float(gap.max()) <= (0 if exact else FLOAT_KV)
    assert torch.equal(warm.cache.layers[0].keys, cold.cache.layers[0].keys)  # the last 5: no replayed one


@pytest.mark.parametrize("kv", list(GEMMA_KV))
@pytest.mark.parametrize(("block", "replay"), [(4, 5), (4, 6), (6, 5)])
def test_a_whole_window_replayed_in_other_passes_than_the_cold_runs_stays_within_the_measured_bound(
        kv: str, block: int, replay: int) -> None:
    """Not promised bit for bit (module docstring): the bound is float rounding, or the other path to NVFP4
    that a small FP8 window gives replayed positions over blocks of 4."""
    warm, cold = warm_and_cold(gemma_engine(kv, replay, block), ids()[:ENTRY], ids(), FIRST)
    assert (warm.cached, cold.cached) == (HIT - replay, 0)
    other_path = GEMMA_KV[kv] == ("nvfp4", 2) and block == 4
    bound = OTHER_PATH_LOGITS if other_path else FLOAT_LOGITS
    assert float((warm.logits - cold.logits).abs().max()) <= bound
    gap = kv_gap(warm.cache.layers[1], cold.cache.layers[1])
    assert float(gap[:HIT].max()) == 0  # read from the cache as the cold run wrote them
    # a query at P + 5 or later sees no replayed position: its output, so the global K/V there, is the cold one
    assert float(gap[HIT + SLIDING - 1:].max()) <= (0 if GEMMA_KV[kv][0] != "none" else FLOAT_KV)
