"""The emulated quantized KV cache: format-none identity, real bytes, scales, window, prefill, batching."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from quant.errors import QuantError
from quant.formats.registry import get_format
from quant.kv.cache import make_cache
from quant.kv.spec import KVQuantSpec
from tests.tiny_models import TINY_LLAMA, padded_ids, plain_kv

torch.set_num_threads(1)
HEADS, HEAD_DIM, LAYERS = TINY_LLAMA["num_attention_heads"], 32, TINY_LLAMA["num_hidden_layers"]
GREEDY = {"do_sample": False, "output_scores": True, "return_dict_in_generate": True}


# ------------------------------------------------------------------ identity and difference


def test_format_none_is_bit_identical_forward_and_generate(llama):
    ids, mask = padded_ids()
    with torch.no_grad():
        ref = llama(input_ids=ids, attention_mask=mask).logits
        out = llama(
            input_ids=ids,
            attention_mask=mask,
            cache=make_cache(llama.config, KVQuantSpec(format="none")),
            use_cache=True,
        ).logits
        assert torch.equal(out, ref)
        kw = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 6, **GREEDY}
        plain = llama.generate(**kw)
        quant = llama.generate(**kw, cache=make_cache(llama.config, KVQuantSpec(format="none")))
    assert torch.equal(plain.sequences, quant.sequences)
    assert all(torch.equal(a, b) for a, b in zip(plain.scores, quant.scores))


def test_format_none_identity_on_sliding_window_layers_past_the_window(gemma):
    ids, mask = padded_ids(length=10)  # 10 prompt + 6 new tokens > window 6
    kw = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 6, **GREEDY}
    with torch.no_grad():
        plain = gemma.generate(**kw)
        cache = make_cache(gemma.config, KVQuantSpec(format="none"))
        quant = gemma.generate(**kw, cache=cache)
    assert torch.equal(plain.sequences, quant.sequences)
    assert all(torch.equal(a, b) for a, b in zip(plain.scores, quant.scores))
    assert cache.layers[0].is_sliding and len(cache.layers[0].k) == 5  # window - 1 tokens kept
    assert cache.layers[0].get_max_length() == 6 and cache.layers[1].get_max_length() == -1


def test_nvfp4_changes_logits_and_sliding_layers_are_quantized(llama, gemma):
    for model in (llama, gemma):
        ids, mask = padded_ids()
        cache = make_cache(model.config, KVQuantSpec(format="nvfp4"))
        with torch.no_grad():
            ref = model(input_ids=ids, attention_mask=mask).logits
            out = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True).logits
        assert not torch.equal(out, ref)
        assert all(layer.format == "nvfp4" for layer in cache.layers)
        assert set(cache.layers[0].k.main[0].data) == {"packed", "scales"}


def test_attention_reads_exactly_the_dequantized_stored_bytes(llama):
    ids, _ = padded_ids(batch=1, pad=0)
    cache = make_cache(llama.config, KVQuantSpec(format="nvfp4"))
    with torch.no_grad():
        llama.generate(input_ids=ids, max_new_tokens=4, do_sample=False, cache=cache)
    fmt = get_format("nvfp4")
    for layer in cache.layers:
        for stream, view in ((layer.k, layer.keys), (layer.v, layer.values)):
            main, _ = stream.stored()
            assert torch.equal(view, fmt.dequantize(main, torch.float32))  # shadow == dequantize(bytes)
    # layer 0 sees the plain model's K: its bytes equal an independent quantization with the prefill's scale
    layer, k = cache.layers[0], plain_kv(llama, ids)[0][0]  # [1, H, T, D]
    main, _ = layer.k.stored()
    d = k.abs().amax() / 2688.0
    ref = fmt.quantize(k, d)
    assert torch.equal(layer.k.scale.reshape(()), d)
    assert torch.equal(main.data["packed"][..., : k.shape[-2], :], ref.data["packed"])
    assert torch.equal(main.data["scales"][..., : k.shape[-2], :], ref.data["scales"])


def test_dynamic_scale_is_fixed_at_the_first_write_per_sequence(llama):
    ids, mask = padded_ids()
    cache = make_cache(llama.config, KVQuantSpec(format="fp8_e4m3"))
    cache.set_padding_mask(mask)
    with torch.no_grad():
        llama.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False, cache=cache)
    single = plain_kv(llama, ids[:1, 3:])  # row 0 without its padding
    both = plain_kv(llama, ids)
    layer = cache.layers[0]  # layer 0 sees the plain model's K
    d = layer.k.scale.flatten()
    assert d.shape == (2,)
    # row 0's scale ignores its padding: it equals the unpadded sequence's (up to matmul rounding)
    torch.testing.assert_close(d[0], single[0][0].abs().amax() / 448.0, rtol=1e-5, atol=0)
    assert torch.equal(d[1], both[0][0][1].abs().amax() / 448.0)
    assert all(torch.equal(q.scale, layer.k.scale) for q in layer.k.main)


# ------------------------------------------------------------------ storage bytes


@pytest.mark.parametrize(("fmt", "bytes_per_element"), [("nvfp4", 0.5625), ("fp8_e4m3", 1.0), ("none", 4.0)])
def test_storage_bytes_match_theory(llama, fmt, bytes_per_element):
    ids, _ = padded_ids(batch=1, length=16, pad=0)
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


# ------------------------------------------------------------------ window, prefill, skip, constant


def test_recent_window_requantizes_tokens_leaving_it(llama):
    ids, _ = padded_ids(batch=1, length=10, pad=0)
    spec = KVQuantSpec(format="nvfp4", recent_window=4, recent_format="fp8_e4m3")
    cache = make_cache(llama.config, spec)
    k = plain_kv(llama, ids)[0][0]
    with torch.no_grad():
        out = llama(input_ids=ids, cache=cache, use_cache=True)
        layer = cache.layers[0]
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
    ids, _ = padded_ids(batch=1, pad=0)
    with torch.no_grad():
        ref = llama(input_ids=ids).logits
        fresh = make_cache(llama.config, KVQuantSpec(format="nvfp4", prefill_reads_quantized=False))
        out = llama(input_ids=ids, cache=fresh, use_cache=True).logits
        assert torch.equal(out, ref)  # prefill attended to the fresh K/V
        step = llama(input_ids=ids[:, :1], cache=fresh, use_cache=True).logits
        ref_step = llama(input_ids=torch.cat([ids, ids[:, :1]], 1)).logits[:, -1:]
    assert not torch.equal(step, ref_step)  # later tokens see the quantized cache


def test_skip_layers_and_per_layer_formats(llama):
    ids, _ = padded_ids(batch=1, pad=0)
    cache = make_cache(llama.config, KVQuantSpec(format="nvfp4", skip_layers=(0,)))
    cache2 = make_cache(llama.config, KVQuantSpec(format="nvfp4", layer_formats={1: "qa_int4"}))
    with torch.no_grad():
        llama(input_ids=ids, cache=cache, use_cache=True)
        llama(input_ids=ids, cache=cache2, use_cache=True)
    plain = plain_kv(llama, ids)
    assert [layer.format for layer in cache.layers] == ["none", "nvfp4"]
    assert torch.equal(cache.layers[0].keys, plain[0][0])  # stored exactly
    assert not torch.equal(cache.layers[1].keys, plain[1][0])
    assert [layer.format for layer in cache2.layers] == ["nvfp4", "qa_int4"]


def test_constant_scale_is_the_decode_scale(llama):
    ids, _ = padded_ids(batch=1, pad=0)
    c1 = make_cache(llama.config, KVQuantSpec(format="nvfp4", scales="constant", constant_scale=1.0))
    with torch.no_grad():
        llama(input_ids=ids, cache=c1, use_cache=True)
    assert float(c1.layers[0].v.scale) == 1.0


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
    ids, mask = padded_ids()
    cache = make_cache(llama.config, KVQuantSpec(format="nvfp4", recent_window=4))
    cache.set_padding_mask(mask)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)  # generate samples from the global RNG: forked, so no other test sees it
        out = llama.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_k=20, cache=cache
        )
    assert out.shape == (2, 18)


def test_crop_removes_the_newest_tokens_from_bytes_and_view(llama):
    ids, _ = padded_ids(batch=1, pad=0)
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
    ids, mask = padded_ids(batch=2, length=40, pad=3)
    kw = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 100, "min_new_tokens": 100, **GREEDY}
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
    none_spec = KVQuantSpec(format="none", recent_window=16, recent_format="none")
    with torch.no_grad():
        plain = llama.generate(**kw)
        none = llama.generate(**kw, cache=make_cache(llama.config, none_spec))
    assert torch.equal(plain.sequences, none.sequences)
    assert all(torch.equal(a, b) for a, b in zip(plain.scores, none.scores, strict=True))


# ------------------------------------------------------------------ validation


def test_make_cache_rejects_bad_layers_scales_and_shapes(llama):
    with pytest.raises(QuantError, match="model has 2 layers"):
        make_cache(llama.config, KVQuantSpec(skip_layers=(5,)))
    with pytest.raises(QuantError, match="static"):
        make_cache(llama.config, KVQuantSpec(scales="static"))
    odd = LlamaConfig(
        num_hidden_layers=1, hidden_size=40, num_attention_heads=2, intermediate_size=64, vocab_size=10
    )
    with pytest.raises(QuantError, match="head_dim 20"):
        make_cache(odd, KVQuantSpec(format="nvfp4"))


# ------------------------------------------------------------------ a real model


@pytest.fixture(scope="module")
def smollm2():
    from evals.errors import ModelError
    from evals.models.load import load_model
    from evals.models.resolve import resolve_model

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
    kw = dict(**batch, max_new_tokens=4, **GREEDY)
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
