"""The architecture matrix of the emulated KV cache (docs/KV_ARCHITECTURES.md): for each transformers family
a tiny random model built here (tests.tiny_models.TINY_FAMILIES), checked against transformers' own cache on
the same inputs: format none bit-identical (prompt past the sliding window, greedy decode), NVFP4 within
its half-step bound on every stored K/V, sliding windows keeping what transformers keeps, MLA storing the
latent and the rope key with one scale, recurrent layers left as transformers' own; and the one-line
refusals of what the cache cannot reproduce."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch
from transformers import DynamicCache

from quant.errors import QuantError
from quant.formats.minifloat import e4m3_from_bytes
from quant.formats.registry import get_format
from quant.kv.cache import make_cache
from quant.kv.calibrate import CalibrationSpec, calibrate
from quant.kv.layer import QuantizedKVLayer
from quant.kv.plain import make_plain_cache
from quant.kv.shape import model_kv_shape
from quant.kv.spec import KVQuantSpec
from tests.tiny_models import TINY_FAMILIES, padded_ids, tiny_family, tiny_family_config

torch.set_num_threads(1)
FAMILIES = tuple(TINY_FAMILIES)
MLA = ("deepseek_v3", "deepseek_v2")
GREEDY = {"do_sample": False, "output_scores": True, "return_dict_in_generate": True, "max_new_tokens": 6}


@cache
def _model(name: str) -> Any:
    """One tiny model per family for the whole module (seed 0)."""
    return tiny_family(name)


def _states_equal(mine: Any, theirs: Any) -> bool:
    """Two caches' layers hold the same tensors (K/V for attention layers, the states of recurrent ones)."""
    if isinstance(mine, QuantizedKVLayer):
        return torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
    if hasattr(theirs, "recurrent_states"):
        return type(mine) is type(theirs) and all(
            torch.equal(mine.recurrent_states[i], theirs.recurrent_states[i])
            and torch.equal(mine.conv_states[i], theirs.conv_states[i])
            for i in theirs.recurrent_states
        )
    return torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)


@pytest.mark.parametrize("name", FAMILIES)
def test_format_none_is_bit_identical_to_transformers_cache(name: str) -> None:
    """Left-padded batch, 10 prompt tokens + 6 greedy ones (past every window of 6): the same tokens, scores
    and final cache contents as transformers' DynamicCache, for the emulated cache and the plain one."""
    model = _model(name)
    ids, mask = padded_ids(length=10)
    with torch.no_grad():
        ref_cache = DynamicCache(config=model.config)
        ref = model.generate(input_ids=ids, attention_mask=mask, cache=ref_cache, **GREEDY)
        for cache_ in (make_cache(model.config, KVQuantSpec(format="none")), make_plain_cache(model.config)):
            out = model.generate(input_ids=ids, attention_mask=mask, cache=cache_, **GREEDY)
            assert torch.equal(out.sequences, ref.sequences)
            assert all(torch.equal(a, b) for a, b in zip(out.scores, ref.scores, strict=True))
            assert len(cache_.layers) == len(ref_cache.layers)
            # sliding layers keep exactly the positions transformers keeps; recurrent states are transformers'
            assert all(_states_equal(a, b) for a, b in zip(cache_.layers, ref_cache.layers, strict=True))
    shape = model_kv_shape(model.config, recurrent_ok=True)
    for layer, window in zip(ref_cache.layers, shape.sliding_windows, strict=True):
        if window is not None:
            assert layer.keys.shape[-2] == window - 1  # 15 positions written, the window's last 5 kept


def _half_step_bound(q: Any, x: torch.Tensor, deq: torch.Tensor) -> torch.Tensor:
    """NVFP4's elementwise error bound for x [B, H, T, D] stored as q: half the largest E2M1 step (1 block
    scale s, in model units), or |x| - 6 s where a subnormal block scale rounded down; an underflowed block
    holds |x| <= 6 * 2**-10 decode scales (tests/quant/formats/test_nvfp4.py); plus one float32 ulp of each side."""
    d = q.scale.double()  # decode scale [B|1, 1|H, 1, 1]
    s = (e4m3_from_bytes(q.data["scales"]).double() * d).repeat_interleave(16, dim=-1)  # [B, H, T, D]
    bound = torch.maximum(torch.where(s == 0, 6 * 2.0**-10 * d, s), x.abs().double() - 6 * s)
    ulps = 2 * torch.finfo(torch.float32).eps * torch.maximum(x.abs(), deq.abs()).double()
    return bound * (1 + 1e-6) + ulps


@pytest.mark.parametrize("name", FAMILIES)
def test_nvfp4_stores_every_kv_layer_within_the_format_bound(name: str) -> None:
    """Prefill attending to its fresh K/V: every layer writes what the plain model writes, logits are the
    plain ones, and each stored (NVFP4) K and V is within the half-step bound of the plain values."""
    model = _model(name)
    ids, _ = padded_ids(batch=1, length=12, pad=0)
    cache_ = make_cache(model.config, KVQuantSpec(format="nvfp4", prefill_reads_quantized=False))
    with torch.no_grad():
        ref_cache = DynamicCache(config=model.config)
        ref = model(input_ids=ids, cache=ref_cache, use_cache=True).logits
        out = model(input_ids=ids, cache=cache_, use_cache=True).logits
    assert torch.equal(out, ref)
    checked = 0
    for mine, theirs in zip(cache_.layers, ref_cache.layers, strict=True):
        if not isinstance(mine, QuantizedKVLayer):  # a recurrent layer: transformers' own, unquantized
            assert _states_equal(mine, theirs)
            continue
        for stream, x in ((mine.k, theirs.keys), (mine.v, theirs.values)):
            main, _ = stream.stored()
            assert main is not None and main.format == "nvfp4" and main.shape == tuple(x.shape)
            deq = stream.view()
            assert not torch.equal(deq, x)
            assert ((deq - x).abs().double() <= _half_step_bound(main, x, deq)).all()
            checked += 1
    assert checked == 2 * len(model_kv_shape(model.config, recurrent_ok=True).attention_layers)


@pytest.mark.parametrize("name", MLA)
def test_mla_caches_the_latent_and_the_rope_key_with_one_scale(name: str) -> None:
    """What vLLM's MLA cache stores: kv_c [B, 1, T, kv_lora_rank] and k_pe [B, 1, T, qk_rope_head_dim], one
    decode scale for the entry (dynamic: the amax of both; static: the larger calibrated amax)."""
    model = _model(name)
    cfg = model.config
    ids, _ = padded_ids(batch=1, length=12, pad=0)
    cache_ = make_cache(cfg, KVQuantSpec(format="nvfp4", prefill_reads_quantized=False))
    with torch.no_grad():
        ref_cache = DynamicCache(config=cfg)
        model(input_ids=ids, cache=ref_cache, use_cache=True)
        model(input_ids=ids, cache=cache_, use_cache=True)
    fmt = get_format("nvfp4")
    for layer, ref in zip(cache_.layers, ref_cache.layers, strict=True):
        assert tuple(ref.keys.shape) == (1, 1, 12, cfg.kv_lora_rank)
        assert tuple(ref.values.shape) == (1, 1, 12, cfg.qk_rope_head_dim)
        amax = torch.maximum(ref.keys.abs().amax(), ref.values.abs().amax())
        assert torch.equal(layer.k.scale, layer.v.scale)
        assert torch.equal(layer.k.scale.reshape(()), fmt.decode_scale_from_amax(amax))
    s = cache_.storage()[0]
    assert (s.k_elements, s.v_elements) == (12 * cfg.kv_lora_rank, 12 * cfg.qk_rope_head_dim)
    assert s.k_bytes == s.k_elements * 0.5625 + 4  # 4.5 bits per element + one float32 decode scale
    chunks = torch.randint(1, 128, (2, 16), generator=torch.Generator().manual_seed(2))
    scales = calibrate(model, chunks, CalibrationSpec(observer="absmax"), data_name="random", model_name=name)
    static = make_cache(cfg, KVQuantSpec(format="nvfp4", scales="static"), scales)
    for i, layer in enumerate(static.layers):
        shared = fmt.decode_scale_from_amax(torch.maximum(scales.k_amax[i], scales.v_amax[i]))
        assert torch.equal(layer.k.scale, shared) and torch.equal(layer.v.scale, shared)


def test_a_hybrid_model_keeps_its_recurrent_layers_unquantized() -> None:
    """qwen3_next: layer 0 (linear attention) is transformers' own layer, outside storage and the row ops."""
    model = _model("qwen3_next")
    cache_ = make_cache(model.config, KVQuantSpec(format="nvfp4"))
    with torch.no_grad():
        model(input_ids=padded_ids(batch=1, pad=0)[0], cache=cache_, use_cache=True)
    assert not isinstance(cache_.layers[0], QuantizedKVLayer) and cache_.layers[0].has_previous_state[0]
    assert [s.layer for s in cache_.storage()] == [1] and cache_.nbytes() > 0
    assert not cache_.supports_rows and not make_plain_cache(model.config).supports_rows
    assert cache_.get_seq_length() == 12


REFUSALS = [  # (family, config overrides, spec, the one line's gist)
    ("qwen3_next", {}, {"skip_layers": [0]}, "names layer 0, a linear_attention layer"),
    ("deepseek_v3", {}, {"format": "qa_int8"}, "quantizes each token's row as one unit"),
    ("deepseek_v3", {}, {"format": "qa_mxfp4"}, "cannot store V of qk_rope_head_dim 16"),
    ("deepseek_v3", {}, {"profile": "flashinfer-nvfp4"}, "is MLA"),
    ("gpt_oss", {}, {"profile": "flashinfer-nvfp4"}, "attends with learned sinks"),
    ("gemma2", {}, {"profile": "flashinfer-nvfp4"}, "attends with a logit soft cap"),
    ("llama", {"head_dim": 12}, {}, "cannot store K of head_dim 12"),
]


@pytest.mark.parametrize(("name", "overrides", "spec", "gist"), REFUSALS)
def test_what_the_cache_cannot_reproduce_is_refused_in_one_line(name: str, overrides: dict, spec: dict,
                                                                 gist: str) -> None:
    with pytest.raises(QuantError, match=gist) as err:
        make_cache(tiny_family_config(name, **overrides), KVQuantSpec(**{"format": "nvfp4", **spec}))
    assert "\n" not in str(err.value)


def test_latent_attention_and_recurrent_layers_are_refused_where_not_checked() -> None:
    """A latent-attention family other than deepseek_v2/v3, and recurrent layers for a step that needs a KV
    cache (calibration, the prefix cache)."""
    from transformers import AutoConfig

    other = AutoConfig.for_model("minicpm3", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                 kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16)
    with pytest.raises(QuantError, match="'minicpm3' has latent attention"):
        make_cache(other, KVQuantSpec(format="none"))
    with pytest.raises(QuantError, match=r"layers \[0\] are linear_attention \(a recurrent state"):
        model_kv_shape(tiny_family_config("qwen3_next"))


def test_a_model_writing_another_layout_than_its_config_says_is_refused() -> None:
    """The config says K/V of width 8; the model writes 16: refused at the first write, nothing mis-stored."""
    model = _model("llama")
    cache_ = make_cache(tiny_family_config("llama", head_dim=8), KVQuantSpec(format="fp8_e4m3"))
    with pytest.raises(QuantError, match="does not know this attention layout"), torch.no_grad():
        model(input_ids=padded_ids(batch=1, pad=0)[0], cache=cache_, use_cache=True)


@pytest.mark.parametrize("name", ["llama", "gemma3_text"])
def test_profile_attention_gets_the_padding_and_window_mask(name: str) -> None:
    """A profile's attention function is registered with SDPA's mask: on a left-padded batch over a window
    of 6, it differs from SDPA only by the profile's rounding (< 0.01 here; 0.26 for llama and 0.50 for
    gemma3 when transformers built no mask for the name). No registered name says "flash" (transformers
    would take it for a flash-attention request)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    from quant.kv.attention import profile_attention

    spec = KVQuantSpec(format="q8_0", profile="llamacpp")
    impl = profile_attention(spec)
    assert impl is not None and impl in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    fi = profile_attention(KVQuantSpec(format="nvfp4", profile="flashinfer-nvfp4"))
    assert fi is not None and "flash" not in fi
    model = tiny_family(name, head_dim=32)  # ggml blocks are 32 wide
    ids, mask = padded_ids(length=16)
    logits = []
    for attention in ("sdpa", impl):
        model.set_attn_implementation(attention)
        with torch.no_grad():
            logits.append(model(input_ids=ids, attention_mask=mask, cache=make_cache(model.config, spec),
                                use_cache=True).logits)
    assert float((logits[1] - logits[0])[0, 3:].abs().max()) < 0.01  # the padded row, past its padding
    assert float((logits[1] - logits[0])[1].abs().max()) < 0.01
    with pytest.raises(QuantError, match="has no s_aux"):
        AttentionInterface()[fi](model, ids[:, None, :, None].float(), ids[:, None, :, None].float(),
                                 ids[:, None, :, None].float(), None, s_aux=torch.zeros(1))
