"""Layers of the emulated cache: row operations (prefill alone, decode as one batch), sliding-window
layers, and the joint K/V and compiled write paths storing exactly what separate eager calls store."""

from __future__ import annotations

import pytest
import torch

from quant.errors import QuantError
from quant.kv.cache import QuantizedKVCache, make_cache
from quant.kv.layer import QuantizedKVLayer
from quant.kv.spec import kv_spec_from_dict
from tests.tiny_models import padded_ids

torch.set_num_threads(1)

ROW_SPECS = [
    {"format": "nvfp4"},
    {"format": "nvfp4", "recent_window": 4, "recent_format": "fp8_e4m3"},
    {"format": "nvfp4", "recent_window": 16, "recent_format": "fp8_e4m3"},  # longer than the short row
    {"format": "qa_int4", "scales": "constant", "constant_scale": 0.05},
]


def _prefill_and_decode(model, spec: dict, steps: int) -> tuple[list[torch.Tensor], QuantizedKVCache]:
    """Greedy decoding of the padded `padded_ids(length=9)` batch through a fresh cache made from `spec`:
    the last-position logits of the prefill and of each decode step but the last, and the cache."""
    ids, mask = padded_ids(length=9)
    cache = make_cache(model.config, kv_spec_from_dict(spec))
    cache.set_padding_mask(mask)
    logits = []
    step_mask = mask
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True).logits[:, -1:]
        for _ in range(steps):
            logits.append(out[:, -1])
            step_mask = torch.cat([step_mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
            out = model(input_ids=out.argmax(-1), attention_mask=step_mask, cache=cache, use_cache=True).logits
    return logits, cache


def _prefilled(model, spec: dict, ids: list[int]) -> QuantizedKVCache:
    cache = make_cache(model.config, kv_spec_from_dict(spec))
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    return cache


def _next_logits(model, cache, mask: torch.Tensor, positions: list[int], token: int = 9) -> torch.Tensor:
    n = len(positions)
    step_mask = torch.cat([mask, torch.ones(n, 1, dtype=torch.long)], dim=1)
    with torch.inference_mode():
        return model(input_ids=torch.full((n, 1), token), cache=cache, attention_mask=step_mask,
                     position_ids=torch.tensor([[p] for p in positions]), use_cache=True).logits[:, -1]


# ---- row operations: sequences prefilled alone, decoded as one right-aligned batch ----


@pytest.mark.parametrize("spec", ROW_SPECS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_rows_prefilled_alone_stack_into_a_batch_that_decodes_like_each_alone(llama, spec):
    gen = torch.Generator().manual_seed(7)
    seqs = [torch.randint(1, 128, (n,), generator=gen).tolist() for n in (21, 3, 12)]
    alone = []
    for s in seqs:
        c = _prefilled(llama, spec, s)
        alone.append(_next_logits(llama, c, torch.ones(1, len(s), dtype=torch.long), [len(s)])[0])
    rows = [_prefilled(llama, spec, s) for s in seqs]
    own = [[(layer.k.stored(), layer.v.stored()) for layer in r.layers] for r in rows]
    for r, s in zip(rows, seqs):
        r.pad_left(21 - len(s))
    batch = QuantizedKVCache.stack(rows)
    assert batch.get_seq_length() == 21
    # the short row's stored bytes (layer 1, K and V) sit unchanged at the end of each region
    for kind in (0, 1):
        stream = (batch.layers[1].k, batch.layers[1].v)[kind]
        for mine, theirs in zip(stream.stored(), own[1][1][kind]):
            if theirs is None:
                continue
            n = theirs.shape[-2]
            for key, t in theirs.data.items():
                assert torch.equal(mine.data[key][1, :, mine.shape[-2] - n :], t[0])
        assert torch.equal(stream.view()[1, :, :18], torch.zeros_like(stream.view()[1, :, :18]))  # padding
    mask = torch.tensor([[0] * (21 - len(s)) + [1] * len(s) for s in seqs])
    got = _next_logits(llama, batch, mask, [len(s) for s in seqs])
    for i in range(3):
        torch.testing.assert_close(got[i], alone[i], rtol=0, atol=1e-5)


@pytest.mark.parametrize("spec", ROW_SPECS[:2], ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_set_row_carries_the_rows_own_dynamic_scale_and_drop_oldest_trims(llama, spec):
    gen = torch.Generator().manual_seed(8)
    a, b, c = (torch.randint(1, 128, (n,), generator=gen).tolist() for n in (30, 26, 5))
    rows = [_prefilled(llama, spec, s) for s in (a, b)]
    rows[1].pad_left(4)
    batch = QuantizedKVCache.stack(rows)
    replacement = _prefilled(llama, spec, c)
    scale_c = replacement.layers[0].k.scale.clone()
    replacement.pad_left(25)
    batch.set_row(0, replacement)
    assert torch.equal(batch.layers[0].k.scale[0], scale_c[0])  # per-sequence scale moved with the row
    mask = torch.tensor([[0] * 25 + [1] * 5, [0] * 4 + [1] * 26])
    batch.drop_oldest(4)
    assert batch.get_seq_length() == 26
    got = _next_logits(llama, batch, mask[:, 4:], [5, 26])
    for i, s in enumerate((c, b)):
        want = _next_logits(llama, _prefilled(llama, spec, s), torch.ones(1, len(s), dtype=torch.long), [len(s)])
        torch.testing.assert_close(got[i], want[0], rtol=0, atol=1e-5)


def test_row_operations_refuse_sliding_window_layers_before_changing_any(gemma):
    cache = _prefilled(gemma, {"format": "nvfp4"}, [5, 6, 7])
    assert not cache.supports_rows and cache.layers[0].is_sliding and not cache.layers[1].is_sliding
    lengths = [len(layer.k) for layer in cache.layers]
    for op in (lambda: cache.pad_left(2), lambda: cache.drop_oldest(1), lambda: cache.set_row(0, cache),
               lambda: QuantizedKVCache.stack([cache, cache]), lambda: cache.layers[0].pad_left(2)):
        with pytest.raises(QuantError, match="sliding-window"):
            op()
    assert [len(layer.k) for layer in cache.layers] == lengths  # the full-attention layer was not padded


def test_sliding_layer_crops_within_its_window_only(gemma):
    cache = _prefilled(gemma, {"format": "nvfp4"}, [5, 6, 7, 8])
    assert not cache.layers[0].is_croppable
    cache.layers[0].crop(-1)  # 4 tokens < window 6: nothing was evicted yet
    assert cache.layers[0].get_seq_length() == 3
    full = _prefilled(gemma, {"format": "nvfp4"}, list(range(1, 9)))  # 8 tokens: past the window
    with pytest.raises(QuantError, match="past its window"):
        full.layers[0].crop(-1)


# ---- the joint K/V path and the compiled round trip ----


@pytest.mark.parametrize("spec", [
    {"format": "nvfp4"},
    {"format": "nvfp4", "recent_window": 4, "recent_format": "fp8_e4m3"},
    {"format": "nvfp4", "recent_window": 5, "recent_format": "fp8_e4m3", "scales": "constant", "constant_scale": 0.5},
], ids=["no-window", "window-dynamic", "window-constant"])
def test_joint_k_v_path_stores_exactly_what_separate_calls_store(llama, spec, monkeypatch):
    def run() -> tuple[list[torch.Tensor], QuantizedKVCache]:
        return _prefill_and_decode(llama, spec, steps=8)  # through the window: tokens leave it at every step

    joint_logits, joint = run()
    assert joint.layers[0]._joint
    with monkeypatch.context() as m:
        m.setattr(QuantizedKVLayer, "_joint", property(lambda self: False))
        separate_logits, separate = run()
    for a, b in zip(joint_logits, separate_logits, strict=True):
        assert torch.equal(a, b)
    for lj, ls in zip(joint.layers, separate.layers, strict=True):
        for sj, ss in ((lj.k, ls.k), (lj.v, ls.v)):
            assert torch.equal(sj.view(), ss.view())
            for qj, qs in zip(sj.stored(), ss.stored(), strict=True):
                assert (qj is None) == (qs is None)
                if qj is not None:
                    assert qj.data.keys() == qs.data.keys()
                    assert all(torch.equal(qj.data[key], qs.data[key]) for key in qj.data)


@pytest.mark.parametrize("spec", [
    {"format": "nvfp4"},
    {"format": "nvfp4", "recent_window": 4, "recent_format": "fp8_e4m3"},
    {"format": "nvfp4", "scales": "constant", "constant_scale": 0.01, "recent_window": 3, "recent_format": "nvfp4"},
], ids=["no-window", "window-dynamic", "window-nvfp4-recent"])
def test_compiled_round_trip_stores_exactly_what_eager_calls_store(llama, spec, monkeypatch):
    from quant.formats import compiled, nvfp4_fused

    calls = []
    real = nvfp4_fused.roundtrip

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(nvfp4_fused, "roundtrip", counted)
    monkeypatch.setenv(compiled.WARMUP_ENV, "0")  # compiled from the first write

    def run() -> tuple[list[torch.Tensor], QuantizedKVCache]:
        return _prefill_and_decode(llama, spec, steps=6)

    fused_logits, fused = run()
    assert calls, "the compiled round trip was not used on CPU"
    n = len(calls)
    monkeypatch.setenv(compiled.ENV, "0")
    eager_logits, eager = run()
    assert len(calls) == n  # switched off: eager quantize + dequantize only
    for a, b in zip(fused_logits, eager_logits, strict=True):
        assert torch.equal(a, b)
    for lf, le in zip(fused.layers, eager.layers, strict=True):
        for sf, se in ((lf.k, le.k), (lf.v, le.v)):
            assert torch.equal(sf.view().view(torch.int32), se.view().view(torch.int32))
            for qf, qe in zip(sf.stored(), se.stored(), strict=True):
                assert (qf is None) == (qe is None)
                if qf is not None:
                    assert all(torch.equal(qf.data[key], qe.data[key]) for key in qe.data)
