"""Engine profiles in the emulated cache and the query-rounding attention, on a tiny random Llama."""

from __future__ import annotations

import torch

from quant.formats.ggml_blocks import hadamard, round_q8_0
from quant.kv.attention import profile_attention
from quant.kv.cache import make_cache
from quant.kv.spec import kv_spec_from_dict
from tests.tiny_models import tiny_llama, tiny_llama_config

CONSTANT_1 = {"scales": "constant", "constant_scale": 1.0}


def _kv(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, 7, 32, generator=g) * 4, torch.randn(1, 2, 7, 32, generator=g) * 4


def test_vllm_cpu_cache_hands_attention_the_truncated_values():
    spec = kv_spec_from_dict({"format": "fp8_e4m3", "profile": "vllm-cpu", **CONSTANT_1})
    k, v = _kv(0)
    keys, values = make_cache(tiny_llama_config(), spec).layers[0].update(k, v)
    rne = k.to(torch.float8_e4m3fn).float()
    # independent truncation: step the nearest value's magnitude code down where it rounded away from zero
    codes = k.to(torch.float8_e4m3fn).view(torch.uint8)
    trunc = torch.where(rne.abs() > k.abs(), codes - 1, codes).view(torch.float8_e4m3fn).float()
    assert torch.equal(keys, torch.where(trunc.abs() < 2.0**-6, 0.0, trunc))  # subnormals read as 0
    assert bool((values.abs() <= v.abs()).all())
    default = make_cache(tiny_llama_config(), kv_spec_from_dict({"format": "fp8_e4m3", **CONSTANT_1}))
    assert torch.equal(default.layers[0].update(k, v)[0], rne)  # no profile: round to nearest, as before


def test_llamacpp_cache_stores_rotated_q8_0_blocks():
    spec = kv_spec_from_dict({"format": "q8_0", "profile": "llamacpp"})
    k, v = _kv(1)
    layer = make_cache(tiny_llama_config(), spec).layers[0]
    keys, _ = layer.update(k, v)
    h = hadamard(32)
    assert torch.allclose(keys, round_q8_0(k @ h) @ h, atol=1e-5)
    stored = layer.k.main[0]
    assert stored.format == "q8_0" and stored.data["codes"].dtype == torch.int8


def test_profile_attention_rounds_queries_and_changes_only_what_it_should():
    model = tiny_llama(seed=0)
    ids = torch.arange(1, 13)[None]
    spec = kv_spec_from_dict({"format": "q8_0", "profile": "llamacpp"})
    name = profile_attention(spec)
    assert name == "qa_kv_profile_llamacpp" and profile_attention(spec) == name  # registered once
    assert profile_attention(kv_spec_from_dict({"format": "nvfp4"})) is None
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        plain_cache = model(ids, past_key_values=make_cache(model.config, spec)).logits
        model.set_attn_implementation(name)
        rounded = model(ids, past_key_values=make_cache(model.config, spec)).logits
        model.set_attn_implementation("sdpa")
    assert not torch.equal(plain_cache, rounded)
    assert torch.allclose(plain_cache, rounded, atol=0.05)  # q8_0 queries: a small perturbation


def test_vllm_cpu_attention_flushes_small_dot_products_and_small_outputs():
    from transformers import AttentionInterface

    name = profile_attention(kv_spec_from_dict({"format": "fp8_e4m3", "profile": "vllm-cpu", **CONSTANT_1}))
    assert name is not None and name.startswith("qa_kv_profile_vllm_cpu_e4m3")
    fn = AttentionInterface()[name]
    q = torch.tensor([[[[1.0, 0.0]]]])  # [B=1, H=1, n=1, D=2]
    k = torch.tensor([[[[0.01, 5.0], [0.5, 0.0]]]])  # q.k = 0.01 (below 2^-6: flushed to 0) and 0.5
    v = torch.tensor([[[[1.0, 0.002], [2.0, 0.002]]]])  # the second output dim stays below 2^-6
    out, _ = fn(None, q, k, v, None, scaling=1.0)
    e = torch.exp(torch.tensor([0.0, 0.5]) - 0.5)  # logits 0 (flushed) and 0.5, max subtracted
    p = e.to(torch.bfloat16).float()
    want0 = float((p[0] * 1.0 + p[1] * 2.0) / e.sum())
    assert out.shape == (1, 1, 1, 2)
    assert abs(float(out[0, 0, 0, 0]) - want0) < 1e-6
    assert float(out[0, 0, 0, 1]) == 0.0  # unflushed it would be 0.002
