"""The vLLM plugin's K/V rewrite (evals.engines.vllm.kv.emulate) against the hf engine's emulated cache:
the same spec and scales give the same values bit for bit, on vLLM's [T, H, D] layout; no vllm needed."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from evals.engines.vllm.kv.emulate import layer_plan, rewrite, rewrite_pair
from quant.errors import QuantError
from quant.formats import compiled
from quant.formats.registry import get_format
from quant.kv.cache import check_named_layers, check_scales_fit, make_cache
from quant.kv.spec import KVQuantSpec
from quant.scales.files import CalibrationData, KVScales, ScalesMeta

LAYERS, HEADS, HEAD_DIM, TOKENS = 3, 2, 32, 7


def _config() -> LlamaConfig:
    return LlamaConfig(num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=HEADS,
                       hidden_size=4 * HEAD_DIM, head_dim=HEAD_DIM, intermediate_size=64, vocab_size=64)


def _scales(granularity: str) -> KVScales:
    k = torch.tensor([[1.0, 3.0], [2.0, 0.5], [8.0, 4.0]])  # calibrated amax [L, H]
    v = torch.tensor([[0.25, 0.5], [6.0, 1.0], [2.0, 2.0]])
    if granularity == "tensor":
        k, v = k.amax(-1), v.amax(-1)
    meta = ScalesMeta(format="nvfp4", convention="decode", observer="absmax", granularity=granularity,
                      num_layers=LAYERS, num_kv_heads=HEADS, model="m",
                      data=CalibrationData(name="d", sha256="0", n_samples=1, seq_len=8), seed=0)
    fmt = get_format("nvfp4")
    return KVScales(k_amax=k, v_amax=v, k_scale=fmt.decode_scale_from_amax(k),
                    v_scale=fmt.decode_scale_from_amax(v), meta=meta)


SPECS = [
    ({"format": "nvfp4", "scales": "static"}, "tensor"),
    ({"format": "nvfp4", "scales": "static"}, "head"),
    ({"format": "fp8_e4m3", "scales": "constant", "constant_scale": 0.01}, None),
    ({"format": "fp8_e5m2", "scales": "constant", "constant_scale": 1.0}, None),
    ({"format": "nvfp4_4over6", "scales": "constant", "constant_scale": 0.002}, None),
    ({"format": "qa_mxfp4"}, None),
    ({"format": "qa_int8"}, None),
    ({"format": "qa_int4", "layer_formats": {1: "qa_mxfp4"}, "skip_layers": [2]}, None),
]


# the specs whose K-and-V call runs compiled here; the others run it eagerly (QA_KV_COMPILED=0): the compiled
# rewrite of every format is checked against quant's reference in tests/quant/formats/test_capture.py, and each
# compile costs CI seconds
COMPILED_HERE = (1,)


@pytest.mark.parametrize(("index", "given", "granularity"), [(i, *s) for i, s in enumerate(SPECS)])
def test_rewrite_equals_the_hf_emulated_cache_bit_for_bit(index, given, granularity, monkeypatch):
    if index not in COMPILED_HERE:
        monkeypatch.setenv(compiled.ENV, "0")
    spec = KVQuantSpec.model_validate(given)
    scales = _scales(granularity) if granularity else None
    cache = make_cache(_config(), spec, scales)
    gen = torch.Generator().manual_seed(0)
    for layer in range(LAYERS):
        k = (torch.randn(1, HEADS, TOKENS, HEAD_DIM, generator=gen) * 3).to(torch.bfloat16)  # hf: [B, H, T, D]
        v = (torch.randn(1, HEADS, TOKENS, HEAD_DIM, generator=gen) * 2).to(torch.bfloat16)
        hf_k, hf_v = cache.update(k, v, layer)
        plan = layer_plan(spec, scales, layer)
        ours_k = rewrite(plan, k[0].transpose(0, 1).contiguous(), "k")  # vLLM: [T, H, D]
        ours_v = rewrite(plan, v[0].transpose(0, 1).contiguous(), "v")
        for t in (TOKENS, 1):  # K and V in one call (prefill, then a decode step's single token)
            pair_k, pair_v = rewrite_pair(plan, k[0, :, -t:].transpose(0, 1), v[0, :, -t:].transpose(0, 1))
            assert torch.equal(pair_k, ours_k[-t:]) and torch.equal(pair_v, ours_v[-t:])
        assert ours_k.dtype == torch.bfloat16
        assert torch.equal(ours_k, hf_k[0].transpose(0, 1))
        assert torch.equal(ours_v, hf_v[0].transpose(0, 1))
        assert plan.identity == (spec.layer_format(layer) == "none")
        if not plan.identity:
            assert not torch.equal(ours_k, k[0].transpose(0, 1))  # something was rounded


def test_mla_layers_share_one_static_scale_from_the_larger_amax():
    spec = KVQuantSpec(format="nvfp4", scales="static")
    plan = layer_plan(spec, _scales("tensor"), 1, mla=True)
    want = get_format("nvfp4").decode_scale_from_amax(torch.tensor(6.0))  # max(k 2.0, v 6.0)
    assert torch.equal(plan.k_scale, want) and torch.equal(plan.v_scale, want)
    kv_c = torch.randn(5, 512, dtype=torch.bfloat16)  # vLLM's latent [T, Dc] and rope key [T, 1, Dr]
    k_pe = torch.randn(5, 1, 64, dtype=torch.bfloat16)
    fmt = get_format("nvfp4")
    assert torch.equal(rewrite(plan, kv_c, "k"), fmt.dequantize(fmt.quantize(kv_c, want), torch.bfloat16))
    assert torch.equal(rewrite(plan, k_pe, "v"), fmt.dequantize(fmt.quantize(k_pe, want), torch.bfloat16))


def test_scales_and_layer_names_that_do_not_fit_the_model_are_refused():
    with pytest.raises(QuantError, match="covers 3 layers, the model has 4"):
        check_scales_fit(_scales("tensor"), 4, HEADS)
    with pytest.raises(QuantError, match="2 KV heads per layer, the model has 1"):
        check_scales_fit(_scales("head"), LAYERS, 1)
    with pytest.raises(QuantError, match="names layer 5, but the model has 3"):
        check_named_layers(KVQuantSpec(format="qa_int8", skip_layers=(5,)), LAYERS)
    with pytest.raises(QuantError, match="static or constant"):
        layer_plan(KVQuantSpec(format="nvfp4"), None, 0)


def test_scales_constants_and_counters_move_to_the_layers_device_once():
    plan = layer_plan(KVQuantSpec(format="nvfp4", scales="static"), _scales("head"), 2)
    meta = torch.device("meta")  # a second device on any machine: tensors without storage
    moved = plan.to(meta)  # what the plugin installs: everything already where the layer is
    assert moved.k_scale.device == meta and moved.v_scale.device == meta and moved.device == meta
    assert moved.prepared.k_const.device == meta and moved.counts.device == meta
    assert plan.k_scale.device.type == "cpu" and plan.device.type == "cpu"  # the plan it came from is unchanged
    out = rewrite(moved, torch.randn(TOKENS, HEADS, HEAD_DIM, device=meta), "k")  # runs there, reads nothing
    assert out.device == meta and out.shape == (TOKENS, HEADS, HEAD_DIM)
    with pytest.raises(QuantError, match="K/V on cpu, but the rewrite was prepared on meta"):
        rewrite(moved, torch.randn(TOKENS, HEADS, HEAD_DIM), "k")
    x = torch.randn(TOKENS, HEADS, HEAD_DIM)
    assert torch.equal(rewrite(plan.to(torch.device("cpu")), x, "k"), rewrite(plan, x, "k"))


@pytest.mark.parametrize("given", [s for s, _ in SPECS])
def test_every_format_rewrites_k_and_v_in_one_call(given, monkeypatch):
    calls = []
    # counted, and run eagerly: what is checked here is that K and V go in one call (the compiled code's values
    # are checked in the test above and in tests/quant/formats/test_capture.py)
    monkeypatch.setattr(compiled, "call", lambda fn, what, *args: calls.append(fn.__name__) or fn(*args))
    plan = layer_plan(KVQuantSpec.model_validate(given), _scales("head"), 0)
    assert plan.prepared is not None  # a capture-safe rewrite for every format
    k, v = torch.randn(3, HEADS, HEAD_DIM), torch.randn(3, HEADS, HEAD_DIM)
    rewrite_pair(plan, k, v)
    assert calls == ([] if plan.identity else ["pair_impl"])  # one compiled call on K and V
