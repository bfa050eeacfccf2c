"""A crop of an emulated cache with an FP8 recent window and a prefix cache (`StreamPlan.rollback`) holds
exactly what the same writes ending at the shorter length hold: main bytes, FP8 window bytes, values.

Why it holds (quant.kv.stream): a position older than the new end's window went to the main format in
both histories the same way (straight from its value, or from its FP8 bytes on leaving the window), and
the positions within the window are held in their FP8 bytes, which the trail kept."""

from __future__ import annotations

import pytest
import torch

from quant.formats.registry import get_format
from quant.kv.cache import make_cache
from quant.kv.qtensor import slice_tokens
from quant.kv.spec import KVQuantSpec
from tests.tiny_models import tiny_llama_config

HEADS, HEAD_DIM = 2, 32  # TINY_LLAMA's
FIXED = {"scales": "constant", "constant_scale": 0.01}  # one decode scale whatever the first write holds


def written(spec: KVQuantSpec, x: torch.Tensor, passes: list[int], end: int):  # -> layer 0 of a cache
    """Layer 0 of a fresh cache after writing x[..., :end, :] as K and V in passes of the given lengths
    (the last pass cut at `end`)."""
    layer = make_cache(tiny_llama_config(), spec).layers[0]
    a = 0
    for n in passes:
        b = min(a + n, end)
        if b > a:
            layer.update(x[..., a:b, :], -x[..., a:b, :])
        a = b
    return layer


def same_state(mine, theirs) -> bool:
    for a, b in ((mine.k, theirs.k), (mine.v, theirs.v)):
        if (a.main_len, a.recent_len) != (b.main_len, b.recent_len) or not torch.equal(a.view(), b.view()):
            return False
        for q, r in zip(a.stored(), b.stored(), strict=True):
            if (q is None) != (r is None):
                return False
            if q is not None and not all(torch.equal(t, r.data[key]) for key, t in q.data.items()):
                return False
    return True


@pytest.mark.parametrize("window", [2, 5, 8, 16])
@pytest.mark.parametrize("passes", [[4] * 10, [7, 3, 12, 1, 9, 8], [40]], ids=["blocks-of-4", "ragged", "one-pass"])
def test_a_crop_holds_what_the_writes_ending_there_hold(window: int, passes: list[int]) -> None:
    spec = KVQuantSpec(format="nvfp4", recent_window=window, prefix_cache={"block": 4}, **FIXED)
    x = torch.randn(1, HEADS, 40, HEAD_DIM, generator=torch.Generator().manual_seed(window))
    full = written(spec, x, passes, 40)
    for end in (39, 33, 24, 17, 12, 9, 3, 1):
        cropped = written(spec, x, passes, 40)
        cropped.crop(end - 40)
        assert cropped.get_seq_length() == end
        assert same_state(cropped, written(spec, x, passes, end)), f"crop to {end}"
    assert not same_state(full, written(spec, x, passes, 39))


def test_without_a_prefix_cache_a_crop_keeps_the_re_quantized_positions() -> None:
    """No trail: the positions that left the window stay in NVFP4 (the emulator's cache outside a
    prefix cache is never cropped into its window: it decodes one token per step)."""
    spec = KVQuantSpec(format="nvfp4", recent_window=8)
    x = torch.randn(1, HEADS, 24, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    layer = written(spec, x, [4] * 6, 24)
    layer.crop(-8)
    assert (layer.k.main_len, layer.k.recent_len) == (16, 0)
    assert not layer.is_croppable


def test_rows_and_batch_operations_carry_the_trail() -> None:
    spec = KVQuantSpec(format="nvfp4", recent_window=8, prefix_cache={"block": 4})
    x = torch.randn(1, HEADS, 24, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    layer = written(spec, x, [4] * 6, 24)
    assert layer.is_croppable
    layer.batch_repeat_interleave(2)
    layer.crop(-6)
    ref = written(spec, x, [4] * 6, 18)
    ref.batch_repeat_interleave(2)
    assert same_state(layer, ref)
    layer.k._consolidate()
    ref.k._consolidate()
    assert torch.equal(layer.k.trail[0].data["values"], ref.k.trail[0].data["values"])


@pytest.mark.parametrize("window", [2, 8])
def test_a_pass_longer_than_a_block_after_a_hit_rounds_the_hits_fp8_window_twice(window: int) -> None:
    """What warm and cold differ by in the stored bytes when passes are longer than a block (docs/CACHE_PATH.md):
    warm holds the entry as its pass [0, P) left it, positions [P - window, P) in FP8, and its next pass moves
    them to NVFP4 from their FP8 bytes; the cold pass [0, T) writes them straight to NVFP4 from their values.
    Every other position is stored alike."""
    spec = KVQuantSpec(format="nvfp4", recent_window=window, prefix_cache={"block": 4}, **FIXED)
    x = torch.randn(1, HEADS, 40, HEAD_DIM, generator=torch.Generator().manual_seed(window))
    hit = 24
    warm = written(spec, x, [hit, 40 - hit], 40)  # the entry's pass up to the hit, then the rest in one pass
    cold = written(spec, x, [40], 40)
    nvfp4, fp8 = get_format("nvfp4"), get_format("fp8_e4m3")
    for sign, a, b in ((1, warm.k, cold.k), (-1, warm.v, cold.v)):
        assert (a.main_len, a.recent_len) == (b.main_len, b.recent_len) == (40 - window, window)
        (main, recent), (cold_main, cold_recent) = a.stored(), b.stored()
        assert main is not None and cold_main is not None and recent is not None and cold_recent is not None
        assert torch.equal(recent.data["values"], cold_recent.data["values"])
        differs = torch.zeros(40 - window, dtype=torch.bool)
        for key, t in main.data.items():
            differs |= (t != cold_main.data[key]).flatten(0, 1).any(dim=0).any(dim=-1)  # [T] per position
        at = [i for i, d in enumerate(differs.tolist()) if d]
        assert at and min(at) >= hit - window and max(at) < hit  # only the FP8 window at the hit, and some of it
        twice = nvfp4.quantize(fp8.dequantize(fp8.quantize(sign * x[..., hit - window:hit, :], a.recent_scale)),
                               a.scale)  # NVFP4 of the FP8 value
        held = slice_tokens(main, hit - window, hit)
        assert all(torch.equal(t, twice.data[key]) for key, t in held.data.items())
