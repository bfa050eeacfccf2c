"""The emulated quantized KV cache: format-none identity, real bytes, scales, window, faults, batching."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from quant.errors import QuantError
from quant.faults import FAULT_PRESETS, fault_spec
from quant.formats import get_format
from quant.kv_cache import QuantizedKVCache, make_cache
from quant.kv_spec import KVQuantSpec, kv_spec_from_dict

torch.set_num_threads(1)
HEADS, HEAD_DIM, LAYERS = 2, 32, 2


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        num_hidden_layers=LAYERS,
        hidden_size=64,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=256,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def gemma() -> Gemma3ForCausalLM:
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=128,
        vocab_size=128,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=256,
        pad_token_id=0,
    )
    return Gemma3ForCausalLM(cfg).eval()


def _ids(batch: int = 2, length: int = 12, pad: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 128, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :pad] = 0  # left padding on the first row
    ids[0, :pad] = 0
    return ids, mask


def _captured_kv(model, ids: torch.Tensor) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, cache=cache, use_cache=True)
    return cache


def _prefill_and_decode(model, spec: dict, steps: int) -> tuple[list[torch.Tensor], QuantizedKVCache]:
    """Greedy decoding of the padded `_ids(length=9)` batch through a fresh cache made from `spec`:
    the last-position logits of the prefill and of each decode step but the last, and the cache."""
    ids, mask = _ids(length=9)
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


# ------------------------------------------------------------------ identity and difference


def test_format_none_is_bit_identical_forward_and_generate(llama):
    ids, mask = _ids()
    with torch.no_grad():
        ref = llama(input_ids=ids, attention_mask=mask).logits
        out = llama(
            input_ids=ids,
            attention_mask=mask,
            cache=make_cache(llama.config, KVQuantSpec(format="none")),
            use_cache=True,
        ).logits
        assert torch.equal(out, ref)
        kw = {
            "input_ids": ids,
            "attention_mask": mask,
            "max_new_tokens": 6,
            "do_sample": False,
            "output_scores": True,
            "return_dict_in_generate": True,
        }
        plain = llama.generate(**kw)
        quant = llama.generate(**kw, cache=make_cache(llama.config, KVQuantSpec(format="none")))
    assert torch.equal(plain.sequences, quant.sequences)
    assert all(torch.equal(a, b) for a, b in zip(plain.scores, quant.scores))


def test_format_none_identity_on_sliding_window_layers_past_the_window(gemma):
    ids, mask = _ids(length=10)  # 10 prompt + 6 new tokens > window 6
    kw = {
        "input_ids": ids,
        "attention_mask": mask,
        "max_new_tokens": 6,
        "do_sample": False,
        "output_scores": True,
        "return_dict_in_generate": True,
    }
    with torch.no_grad():
        plain = gemma.generate(**kw)
        cache = make_cache(gemma.config, KVQuantSpec(format="none"))
        quant = gemma.generate(**kw, cache=cache)
    assert torch.equal(plain.sequences, quant.sequences)
    assert all(torch.equal(a, b) for a, b in zip(plain.scores, quant.scores))
    assert cache.layers[0].is_sliding and len(cache.layers[0].k) == 5  # window - 1 tokens kept


def test_nvfp4_changes_logits_and_sliding_layers_are_quantized(llama, gemma):
    for model in (llama, gemma):
        ids, mask = _ids()
        cache = make_cache(model.config, KVQuantSpec(format="nvfp4"))
        with torch.no_grad():
            ref = model(input_ids=ids, attention_mask=mask).logits
            out = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True).logits
        assert not torch.equal(out, ref)
        assert all(layer.format == "nvfp4" for layer in cache.layers)
        assert set(cache.layers[0].k.main[0].data) == {"packed", "scales"}


def test_attention_reads_exactly_the_dequantized_stored_bytes(llama):
    ids, _ = _ids(batch=1, pad=0)
    cache = make_cache(llama.config, KVQuantSpec(format="nvfp4"))
    with torch.no_grad():
        llama.generate(input_ids=ids, max_new_tokens=4, do_sample=False, cache=cache)
    plain = _captured_kv(llama, ids)
    fmt = get_format("nvfp4")
    for layer in cache.layers:
        for stream, view in ((layer.k, layer.keys), (layer.v, layer.values)):
            main, _ = stream.stored()
            assert torch.equal(view, fmt.dequantize(main, torch.float32))  # shadow == dequantize(bytes)
    # layer 0 sees the plain model's K: its bytes equal an independent quantization with the prefill's scale
    layer, k = cache.layers[0], plain.layers[0].keys  # [1, H, T, D]
    main, _ = layer.k.stored()
    d = k.abs().amax() / 2688.0
    ref = fmt.quantize(k, d)
    assert torch.equal(layer.k.scale.reshape(()), d)
    assert torch.equal(main.data["packed"][..., : k.shape[-2], :], ref.data["packed"])
    assert torch.equal(main.data["scales"][..., : k.shape[-2], :], ref.data["scales"])


def test_dynamic_scale_is_fixed_at_the_first_write_per_sequence(llama):
    ids, mask = _ids()
    cache = make_cache(llama.config, KVQuantSpec(format="fp8_e4m3"))
    cache.set_padding_mask(mask)
    with torch.no_grad():
        llama.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False, cache=cache)
        single = _captured_kv(llama, ids[:1, 3:])  # row 0 without its padding
        both = _captured_kv(llama, ids)
    layer = cache.layers[0]  # layer 0 sees the plain model's K
    d = layer.k.scale.flatten()
    assert d.shape == (2,)
    # row 0's scale ignores its padding: it equals the unpadded sequence's (up to matmul rounding)
    torch.testing.assert_close(d[0], single.layers[0].keys.abs().amax() / 448.0, rtol=1e-5, atol=0)
    assert torch.equal(d[1], both.layers[0].keys[1].abs().amax() / 448.0)
    assert all(torch.equal(q.scale, layer.k.scale) for q in layer.k.main)


# ------------------------------------------------------------------ storage bytes


@pytest.mark.parametrize(("fmt", "bytes_per_element"), [("nvfp4", 0.5625), ("fp8_e4m3", 1.0), ("none", 4.0)])
def test_storage_bytes_match_theory(llama, fmt, bytes_per_element):
    ids, _ = _ids(batch=1, length=16, pad=0)
    cache = make_cache(llama.config, KVQuantSpec(format=fmt))
    with torch.no_grad():
        llama.generate(input_ids=ids, max_new_tokens=4, do_sample=False, cache=cache)
    tokens = cache.get_seq_length()
    assert tokens == 19  # 16 prompt + 3 written (the 4th token is never fed back)
    elements = HEADS * HEAD_DIM * tokens  # per layer, per K or V, batch 1
    per_tensor_scale = 4 if get_format(fmt).needs_tensor_scale else 0  # one fp32 per layer per K/V
    for s in cache.storage():
        assert s.k_elements == s.v_elements == elements
        assert s.k_bytes == s.v_bytes == elements * bytes_per_element + per_tensor_scale
    assert cache.nbytes() == LAYERS * 2 * (elements * bytes_per_element + per_tensor_scale)


# ------------------------------------------------------------------ window, prefill, skip, static


def test_recent_window_requantizes_tokens_leaving_it(llama):
    ids, _ = _ids(batch=1, length=10, pad=0)
    spec = KVQuantSpec(format="nvfp4", recent_window=4, recent_format="fp8_e4m3")
    cache = make_cache(llama.config, spec)
    with torch.no_grad():
        out = llama(input_ids=ids, cache=cache, use_cache=True)
        plain = _captured_kv(llama, ids)
        layer, k = cache.layers[0], plain.layers[0].keys
        assert (layer.k.main_len, layer.k.recent_len) == (6, 4)
        nv, f8 = get_format("nvfp4"), get_format("fp8_e4m3")
        amax = k.abs().amax()
        d_nv, d_f8 = nv.decode_scale_from_amax(amax), f8.decode_scale_from_amax(amax)
        # prompt tokens older than the window go to NVFP4 directly, the last 4 to FP8
        assert torch.equal(layer.k.main[0].data["packed"], nv.quantize(k[..., :6, :], d_nv).data["packed"])
        assert torch.equal(
            layer.k.recent.data["values"].view(torch.uint8),
            f8.quantize(k[..., 6:, :], d_f8).data["values"].view(torch.uint8),
        )
        # one decode step pushes token 6 out of the window: re-quantized from its stored FP8 value
        nxt = out.logits[:, -1:].argmax(-1)
        llama(input_ids=nxt, cache=cache, use_cache=True)
    assert (layer.k.main_len, layer.k.recent_len) == (7, 4)
    fp8_value = f8.dequantize(f8.quantize(k[..., 6:7, :], d_f8))
    main, _ = layer.k.stored()
    assert torch.equal(main.data["packed"][..., 6:7, :], nv.quantize(fp8_value, d_nv).data["packed"])
    assert layer.keys.shape[-2] == 11


def test_prefill_reads_fresh_values_when_asked(llama):
    ids, _ = _ids(batch=1, pad=0)
    with torch.no_grad():
        ref = llama(input_ids=ids).logits
        fresh = make_cache(llama.config, KVQuantSpec(format="nvfp4", prefill_reads_quantized=False))
        out = llama(input_ids=ids, cache=fresh, use_cache=True).logits
        assert torch.equal(out, ref)  # prefill attended to the fresh K/V
        step = llama(input_ids=ids[:, :1], cache=fresh, use_cache=True).logits
        ref_step = llama(input_ids=torch.cat([ids, ids[:, :1]], 1)).logits[:, -1:]
    assert not torch.equal(step, ref_step)  # later tokens see the quantized cache


def test_skip_layers_and_per_layer_formats(llama):
    ids, _ = _ids(batch=1, pad=0)
    cache = make_cache(llama.config, KVQuantSpec(format="nvfp4", skip_layers=(0,)))
    cache2 = make_cache(llama.config, KVQuantSpec(format="nvfp4", layer_formats={1: "int4"}))
    with torch.no_grad():
        llama(input_ids=ids, cache=cache, use_cache=True)
        llama(input_ids=ids, cache=cache2, use_cache=True)
    plain = _captured_kv(llama, ids)
    assert [layer.format for layer in cache.layers] == ["none", "nvfp4"]
    assert torch.equal(cache.layers[0].keys, plain.layers[0].keys)  # stored exactly
    assert not torch.equal(cache.layers[1].keys, plain.layers[1].keys)
    assert [layer.format for layer in cache2.layers] == ["nvfp4", "int4"]


def test_constant_and_multiplied_scales(llama):
    ids, _ = _ids(batch=1, pad=0)
    c1 = make_cache(llama.config, KVQuantSpec(format="nvfp4", scales="constant", constant_scale=1.0))
    c10 = make_cache(llama.config, KVQuantSpec(format="nvfp4", scale_multiplier=10.0))
    with torch.no_grad():
        llama(input_ids=ids, cache=c1, use_cache=True)
        llama(input_ids=ids, cache=c10, use_cache=True)
    plain = _captured_kv(llama, ids)
    assert float(c1.layers[0].v.scale) == 1.0
    d = plain.layers[0].values.abs().amax() / 2688.0
    torch.testing.assert_close(c10.layers[0].v.scale.reshape(()), d * 10.0)


# ------------------------------------------------------------------ batching, prefix reuse, sampling


def test_prefix_cache_expands_to_a_batch_without_requantizing(llama):
    prefix = torch.randint(1, 128, (1, 8), generator=torch.Generator().manual_seed(3))
    suffix = torch.randint(1, 128, (3, 2), generator=torch.Generator().manual_seed(4))
    spec = KVQuantSpec(format="nvfp4")
    with torch.no_grad():
        base = make_cache(llama.config, spec)
        llama(input_ids=prefix, cache=base, use_cache=True)
        shared = base.clone()
        shared.batch_repeat_interleave(3)
        out = llama(input_ids=suffix, cache=shared, use_cache=True).logits
        for row in range(3):
            own = base.clone()
            ref = llama(input_ids=suffix[row : row + 1], cache=own, use_cache=True).logits
            torch.testing.assert_close(out[row : row + 1], ref, rtol=1e-5, atol=1e-5)
    main, _ = shared.layers[0].k.stored()
    base_main, _ = base.layers[0].k.stored()
    assert torch.equal(main.data["packed"][:, :, :8], base_main.data["packed"].repeat_interleave(3, 0))
    assert base.get_seq_length() == 8  # the clone shares nothing with the prefix cache


def test_sampled_batched_generation_with_padding_runs(llama):
    ids, mask = _ids()
    cache = make_cache(llama.config, KVQuantSpec(format="nvfp4", recent_window=4))
    cache.set_padding_mask(mask)
    torch.manual_seed(0)
    with torch.no_grad():
        out = llama.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_k=20, cache=cache
        )
    assert out.shape == (2, 18)


# ------------------------------------------------------------------ faults


def test_fault_presets_are_valid_specs():
    for name in FAULT_PRESETS:
        assert isinstance(fault_spec(name), KVQuantSpec)
    with pytest.raises(QuantError, match="did you mean 'scale_10x'"):
        fault_spec("scale_10")


@pytest.mark.parametrize("layout", ["reversed", "transposed"])
def test_v_scale_layout_fault_changes_v_only(llama, layout):
    ids, _ = _ids(batch=1, pad=0)
    good = make_cache(llama.config, KVQuantSpec(format="nvfp4"))
    bad = make_cache(llama.config, KVQuantSpec(format="nvfp4", v_scale_layout=layout))
    with torch.no_grad():
        llama(input_ids=ids, cache=good, use_cache=True)
        llama(input_ids=ids, cache=bad, use_cache=True)
    for g, b in zip(good.layers[:1], bad.layers[:1]):
        assert torch.equal(g.keys, b.keys)
        assert not torch.equal(g.values, b.values)
        assert torch.equal(g.v.stored()[0].data["scales"], b.v.stored()[0].data["scales"])  # bytes as written
        # the reader's view: scales of (head h, block j) taken from another block of the same token
        s = g.v.stored()[0].data["scales"]  # [1, H, T, nb]
        flat = s.permute(0, 2, 1, 3).reshape(1, s.shape[2], -1)
        read = (
            flat.flip(-1)
            if layout == "reversed"
            else flat.reshape(1, s.shape[2], s.shape[3], HEADS).transpose(-1, -2)
        )
        fixed = read.reshape(1, s.shape[2], HEADS, s.shape[3]).permute(0, 2, 1, 3)
        q = g.v.stored()[0]
        from dataclasses import replace

        expect = get_format("nvfp4").dequantize(replace(q, data={**q.data, "scales": fixed}))
        assert torch.equal(b.values, expect)


def test_corruption_hits_about_the_requested_share_and_is_seeded(llama):
    ids = torch.randint(1, 128, (1, 64), generator=torch.Generator().manual_seed(5))
    caches = [
        make_cache(llama.config, KVQuantSpec(format="nvfp4", corrupt_block_fraction=0.1, corrupt_seed=s))
        for s in (0, 0, 1)
    ]
    clean = make_cache(llama.config, KVQuantSpec(format="nvfp4"))
    with torch.no_grad():
        for c in (*caches, clean):
            llama(input_ids=ids, cache=c, use_cache=True)
    a, b, other = (c.layers[0].k.stored()[0].data["packed"] for c in caches)
    ref = clean.layers[0].k.stored()[0].data["packed"]
    assert torch.equal(a, b) and not torch.equal(a, other)
    blocks_changed = (a != ref).reshape(1, HEADS, 64, -1, 8).any(-1).float().mean().item()
    assert 0.05 < blocks_changed < 0.15  # 10% of blocks drawn (a few random draws equal the original bytes)
    assert torch.equal(
        caches[0].layers[0].k.stored()[0].data["scales"], clean.layers[0].k.stored()[0].data["scales"]
    )


# ------------------------------------------------------------------ validation


def test_spec_validation_errors_are_one_line_quant_errors():
    with pytest.raises(QuantError, match="did you mean 'nvfp4'"):
        kv_spec_from_dict({"format": "nvfp"})
    with pytest.raises(QuantError, match="recent_window"):
        kv_spec_from_dict({"recent_window": -1})
    with pytest.raises(QuantError, match="unknown key 'formt'; did you mean 'format'"):
        kv_spec_from_dict({"formt": "nvfp4"})
    with pytest.raises(QuantError, match="constant_scale"):
        kv_spec_from_dict({"scales": "constant"})
    with pytest.raises(QuantError, match="block-scaled"):
        kv_spec_from_dict({"format": "fp8_e4m3", "v_scale_layout": "reversed"})


def test_make_cache_rejects_bad_layers_models_and_shapes(llama):
    with pytest.raises(QuantError, match="model has 2 layers"):
        make_cache(llama.config, KVQuantSpec(skip_layers=(5,)))
    with pytest.raises(QuantError, match="static"):
        make_cache(llama.config, KVQuantSpec(scales="static"))
    odd = LlamaConfig(
        num_hidden_layers=1, hidden_size=40, num_attention_heads=2, intermediate_size=64, vocab_size=10
    )
    with pytest.raises(QuantError, match="head_dim 20"):
        make_cache(odd, KVQuantSpec(format="nvfp4"))
    from transformers import T5Config

    with pytest.raises(QuantError, match="encoder-decoder"):
        make_cache(T5Config(), KVQuantSpec())
    hybrid = LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=64, vocab_size=10
    )
    hybrid.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(QuantError, match="linear_attention"):
        make_cache(hybrid, KVQuantSpec())


# ------------------------------------------------------------------ a real model


@pytest.fixture(scope="module")
def smollm2():
    from evals.errors import ModelError
    from evals.models import load_model, resolve_model

    try:
        model, tokenizer = load_model(resolve_model("smollm2-135m"))
    except ModelError as exc:
        pytest.skip(f"SmolLM2 not available: {exc}")
    return model, tokenizer


def test_smollm2_none_is_bit_identical_and_nvfp4_is_not(smollm2):
    model, tok = smollm2
    batch = tok(
        ["The capital of France is", "A KV cache stores the keys and values of"],
        return_tensors="pt",
        padding=True,
        padding_side="left",
    )
    kw = dict(**batch, max_new_tokens=4, do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        plain = model.generate(**kw)
        none = model.generate(**kw, cache=make_cache(model.config, KVQuantSpec(format="none")))
        nv_cache = make_cache(model.config, KVQuantSpec(format="nvfp4"))
        nv_cache.set_padding_mask(batch["attention_mask"])
        nvfp4 = model.generate(**kw, cache=nv_cache)
    assert torch.equal(plain.sequences, none.sequences)
    assert all(torch.equal(a, b) for a, b in zip(plain.scores, none.scores))
    assert not torch.equal(plain.scores[0], nvfp4.scores[0])
    assert len(nv_cache.layers) == 30 and nv_cache.layers[0].k.view().shape[1:] == (
        3,
        batch["input_ids"].shape[1] + 3,
        64,
    )


def test_crop_removes_the_newest_tokens_from_bytes_and_view(llama):
    ids, _ = _ids(batch=1, pad=0)
    cache = make_cache(llama.config, KVQuantSpec(format="nvfp4"))
    with torch.no_grad():
        llama(input_ids=ids, cache=cache, use_cache=True)
    before = cache.layers[0].keys.clone()
    cache.crop(-3)
    layer = cache.layers[0]
    assert cache.get_seq_length() == 9 and cache.is_croppable
    assert torch.equal(layer.keys, before[..., :9, :])
    assert torch.equal(layer.keys, get_format("nvfp4").dequantize(layer.k.stored()[0]))
    assert not make_cache(llama.config, KVQuantSpec(format="nvfp4", recent_window=4)).is_croppable



def test_long_generation_through_buffer_growth_keeps_shadow_equal_to_stored_bytes(llama):
    """Past the shadow buffer's first capacities (64, 128 tokens): with a recent window, the view attention
    reads equals dequantize(main bytes) ++ dequantize(recent bytes) exactly, and format none stays
    bit-identical to the plain model."""
    ids, mask = _ids(batch=2, length=40, pad=3)
    kw = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 100, "min_new_tokens": 100,
          "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    cache = make_cache(llama.config, KVQuantSpec(format="nvfp4", recent_window=16, recent_format="fp8_e4m3"))
    with torch.no_grad():
        llama.generate(**kw, cache=cache)
    nv, f8 = get_format("nvfp4"), get_format("fp8_e4m3")
    for layer in cache.layers:
        for stream, view in ((layer.k, layer.keys), (layer.v, layer.values)):
            main, recent = stream.stored()
            assert (stream.main_len, stream.recent_len) == (139 - 16, 16)  # 140 tokens; the last is not written
            expected = torch.cat([nv.dequantize(main, torch.float32), f8.dequantize(recent, torch.float32)], dim=-2)
            assert torch.equal(view, expected)
    with torch.no_grad():
        plain = llama.generate(**kw)
        none = llama.generate(**kw, cache=make_cache(llama.config, KVQuantSpec(format="none", recent_window=16,
                                                                              recent_format="none")))
    assert torch.equal(plain.sequences, none.sequences)
    assert all(torch.equal(a, b) for a, b in zip(plain.scores, none.scores, strict=True))


# ---- row operations: sequences prefilled alone, decoded as one right-aligned batch ----

ROW_SPECS = [
    {"format": "nvfp4"},
    {"format": "nvfp4", "recent_window": 4, "recent_format": "fp8_e4m3"},
    {"format": "nvfp4", "recent_window": 16, "recent_format": "fp8_e4m3"},  # longer than the short row
    {"format": "int4", "scales": "constant", "constant_scale": 0.05},
]


def _prefilled(model, spec: dict, ids: list[int]):
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
    batch = type(rows[0]).stack(rows)
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
    batch = type(rows[0]).stack(rows)
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


def test_row_operations_refuse_sliding_window_layers(gemma):
    cache = make_cache(gemma.config, kv_spec_from_dict({"format": "nvfp4"}))
    assert not cache.supports_rows
    with pytest.raises(QuantError, match="sliding-window"):
        cache.pad_left(2)
    with pytest.raises(QuantError, match="sliding-window"):
        type(cache).stack([cache, cache])


@pytest.mark.parametrize("spec", [
    {"format": "nvfp4"},
    {"format": "nvfp4", "recent_window": 4, "recent_format": "fp8_e4m3"},
    {"format": "nvfp4", "recent_window": 5, "recent_format": "fp8_e4m3", "scales": "constant", "constant_scale": 0.5},
], ids=["no-window", "window-dynamic", "window-constant"])
def test_joint_k_v_path_stores_exactly_what_separate_calls_store(llama, spec, monkeypatch):
    from quant.kv_cache import QuantizedKVLayer

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
    from quant import compiled, nvfp4_fused

    calls = []
    real = nvfp4_fused.roundtrip

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(nvfp4_fused, "roundtrip", counted)

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
