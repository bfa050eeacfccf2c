"""kv-inspect numbers against a reference quantizer applied to the same captured K/V."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from quant.formats import get_format
from quant.inspect import InspectReport, inspect_kv, plot_report
from quant.kv_spec import KVQuantSpec
from quant.minifloat import e4m3_round

torch.set_num_threads(1)
LAYERS = 2


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        num_hidden_layers=LAYERS,
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def prompts() -> torch.Tensor:
    return torch.randint(0, 128, (3, 24), generator=torch.Generator().manual_seed(2))


def _captured(model, prompts):
    out = []
    for row in prompts:
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=row[None], cache=cache, use_cache=True)
        out.append([(layer.keys, layer.values) for layer in cache.layers])
    return out  # [prompt][layer] -> (K, V) each [1, H, T, D]


def test_sqnr_and_error_match_a_reference_quantizer(llama, prompts):
    report = inspect_kv(llama, prompts, KVQuantSpec(format="nvfp4"))
    fmt = get_format("nvfp4")
    captured = _captured(llama, prompts)
    for i in range(LAYERS):
        for kind in (0, 1):
            signal = noise = 0.0
            for per_layer in captured:
                x = per_layer[i][kind].double()
                d = (per_layer[i][kind].abs().amax() / 2688.0).reshape(1, 1, 1, 1)  # dynamic, per sequence
                xhat = fmt.dequantize(fmt.quantize(per_layer[i][kind], d)).double()
                signal += float((x * x).sum())
                noise += float(((xhat - x) ** 2).sum())
            stats = report.layers[i].k if kind == 0 else report.layers[i].v
            assert stats.sqnr_db == pytest.approx(10 * math.log10(signal / noise), rel=1e-5)
            assert stats.rel_error == pytest.approx(math.sqrt(noise / signal), rel=1e-5)
        assert 0 < report.layers[i].attn_rel_error < 1


def test_format_none_is_exact(llama, prompts):
    report = inspect_kv(llama, prompts, KVQuantSpec(format="none"))
    for layer in report.layers:
        assert layer.k.sqnr_db == math.inf and layer.v.rel_error == 0.0 and layer.attn_rel_error == 0.0
    assert InspectReport.model_validate_json(report.model_dump_json()) == report  # inf survives JSON


def test_underflow_and_saturation_shares_match_the_block_scales(llama, prompts):
    captured = _captured(llama, prompts)
    # a constant decode scale far too large: small blocks' E4M3 scale (amax / 6) / d rounds to 0 (underflow)
    under = inspect_kv(llama, prompts, KVQuantSpec(format="nvfp4", scales="constant", constant_scale=30.0))
    # a scale 100x too small: every block whose amax exceeds 2688 * d saturates
    over = inspect_kv(llama, prompts, KVQuantSpec(format="nvfp4", scale_multiplier=0.01))
    for i in range(LAYERS):
        blocks = torch.cat([p[i][1].reshape(-1, 16) for p in captured])  # V blocks of 16 along head_dim
        amax = blocks.abs().amax(-1)
        gs = torch.tensor(
            1 / 30.0, dtype=torch.float32
        )  # encode scale fl32(1/d), kernel order gs * (amax * 1/6)
        expect_under = float(((amax > 0) & (e4m3_round(gs * (amax * (1 / 6.0))) == 0)).float().mean())
        assert under.layers[i].v.underflow_share == pytest.approx(expect_under, abs=1e-7)
        d = torch.cat(
            [(p[i][1].abs().amax() / 2688.0 * 0.01).expand(p[i][1].numel() // 16) for p in captured]
        )
        expect_sat = float((amax / d > 2688.0).float().mean())
        assert over.layers[i].v.saturation_share == pytest.approx(expect_sat, abs=1e-7)
        assert expect_sat > 0
    assert any(layer.v.underflow_share > 0 for layer in under.layers)


def test_report_json_round_trip_and_plot(llama, prompts, tmp_path):
    report = inspect_kv(llama, prompts[:1], KVQuantSpec(format="fp8_e4m3"), model_name="tiny")
    again = InspectReport.model_validate_json(report.model_dump_json())
    assert again == report and again.n_prompts == 1 and again.tokens_per_prompt == 24
    png = plot_report(report, tmp_path / "sqnr.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
