"""Engine profiles: their rounding on small tensors against independent computations (torch's FP8 casts,
vLLM-CPU's bit formula, ggml's blocks in the rotated basis), and the spec key parsed or refused."""

from __future__ import annotations

import pytest
import torch

from quant.errors import QuantError
from quant.formats import fp8
from quant.formats.ggml_blocks import GGML_FORMATS, hadamard, round_q8_0
from quant.formats.registry import FP8Format, get_format
from quant.kv.profiles import (
    RotatedFormat,
    SubnormalsAsZero,
    get_profile,
    profile_format,
    round_query,
    spec_format,
)
from quant.kv.spec import KVQuantSpec, kv_spec_from_dict

FP8_TYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _grid(kind: str) -> torch.Tensor:
    """Every finite FP8 value of `kind`, float32, ascending."""
    v = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_TYPES[kind]).float()
    return v[torch.isfinite(v)].unique()


def _toward_zero(y: torch.Tensor, kind: str) -> torch.Tensor:
    """The FP8 value of largest magnitude not above |y|, with y's sign (independent of quant.formats.fp8)."""
    grid = _grid(kind)
    mags = grid[grid >= 0]
    a = y.abs().clamp(max=float(mags.max()))
    idx = torch.searchsorted(mags, a, right=True) - 1
    return torch.sign(y) * mags[idx]


def _vllm_e4m3_bits(y: float) -> int:
    """vLLM-CPU's float_to_fp8e4m3_scalar: clamp, scale by 2**-120, take float32 bits 20..26 (and the sign)."""
    import struct

    y = max(-448.0, min(448.0, y))
    if y == 0.0:
        return 0
    bits = struct.unpack("<I", struct.pack("<f", y * 2.0**-120))[0]
    payload = min((bits >> 20) & 0x7F, 0x7E)
    return ((bits >> 24) & 0x80) | payload


@pytest.mark.parametrize("kind", ["e4m3", "e5m2"])
def test_toward_zero_fp8_is_the_truncated_grid_value(kind):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g) * 40
    x[:4] = torch.tensor([0.0, 1e6, -1e6, 3e-5])  # zero, saturation both ways, a subnormal
    d = torch.tensor(1.0)
    got = fp8.quantize(x, d, kind, "toward_zero").float()
    assert torch.equal(got, _toward_zero(x, kind))
    nearest = x.clamp(-fp8.FP8_MAX[kind], fp8.FP8_MAX[kind]).to(FP8_TYPES[kind]).float()
    assert torch.equal(fp8.quantize(x, d, kind).float(), nearest)  # the default is unchanged
    assert bool((got.abs() <= x.abs()).all()) and not torch.equal(got, nearest)


def test_toward_zero_e4m3_bytes_match_vllm_cpu_bit_formula():
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.randn(2000, generator=g) * 10, torch.randn(200, generator=g) * 0.01])
    got = fp8.quantize(x, torch.tensor(1.0), "e4m3", "toward_zero").view(torch.uint8)
    assert got.tolist() == [_vllm_e4m3_bits(v) for v in x.tolist()]


def test_toward_zero_uses_the_reciprocal_scale():
    x = torch.tensor([1.0, -3.3, 100.0])
    d = torch.tensor(0.37)
    got = fp8.quantize(x, d, "e4m3", "toward_zero").float()
    assert torch.equal(got, _toward_zero(x * (1.0 / d), "e4m3"))


@pytest.mark.parametrize("kind", ["e4m3", "e5m2"])
def test_vllm_cpu_profile_stores_truncated_fp8_and_reads_subnormals_as_zero(kind):
    fmt = profile_format("vllm-cpu", f"fp8_{kind}")
    assert isinstance(fmt, SubnormalsAsZero) and fmt.name == f"fp8_{kind}"
    assert isinstance(fmt.inner, FP8Format) and fmt.inner.rounding == "toward_zero"
    x = torch.randn(2, 3, 5, 64, generator=torch.Generator().manual_seed(2))
    x[0, 0, 0, :4] = torch.tensor([0.005, -0.003, 1e-5, 2e-7])  # E4M3 / E5M2 subnormals
    d = torch.tensor(0.5)
    q = fmt.quantize(x, d)
    assert torch.equal(q.data["values"].float(), _toward_zero(x * 2.0, kind))  # stored: truncated x / d
    tiny = {"e4m3": 2.0**-6, "e5m2": 2.0**-14}[kind]  # each format's smallest normal
    want = torch.where(_toward_zero(x * 2.0, kind).abs() < tiny, 0.0, _toward_zero(x * 2.0, kind)) * 0.5
    assert torch.equal(fmt.dequantize(q, torch.float32), want)
    assert float(fmt.dequantize(q)[0, 0, 0, 0]) == (0.0 if kind == "e4m3" else float(want[0, 0, 0, 0]))
    assert profile_format(None, "fp8_e4m3") is get_format("fp8_e4m3")  # no profile: the formats' own


def test_llamacpp_profile_quantizes_in_the_rotated_basis():
    fmt = profile_format("llamacpp", "q8_0")
    assert isinstance(fmt, RotatedFormat) and fmt.name == "q8_0"
    x = torch.randn(1, 2, 3, 64, generator=torch.Generator().manual_seed(3))
    h = hadamard(64)
    q8 = GGML_FORMATS["q8_0"]
    want = q8.dequantize(q8.quantize(x @ h), torch.float32) @ h.T
    assert torch.allclose(fmt.dequantize(fmt.quantize(x), torch.float32), want, atol=1e-6)
    nv = profile_format("llamacpp", "nvfp4")
    assert isinstance(nv, RotatedFormat) and nv.inner is get_format("nvfp4")


def test_flashinfer_profile_stores_nvfp4_as_is_and_rounds_queries_to_e4m3():
    assert profile_format("flashinfer-nvfp4", "nvfp4") is get_format("nvfp4")
    assert get_profile("flashinfer-nvfp4").query == "fp8_e4m3"


def test_round_query_q8_0_rotated_and_fp8():
    q = torch.randn(1, 2, 4, 32, generator=torch.Generator().manual_seed(5))
    h = hadamard(32)
    assert torch.allclose(round_query(q, "q8_0", True), round_q8_0(q @ h) @ h, atol=1e-6)
    assert torch.equal(round_query(q, "q8_0", False), round_q8_0(q))
    assert torch.equal(round_query(q, "fp8_e4m3", False), q.to(torch.float8_e4m3fn).float())
    assert round_query(q, "none", True) is q


def test_profiles_name_their_engines_and_unknown_names_get_a_hint():
    assert get_profile("vllm-cpu").fp8_rounding == "toward_zero"
    assert get_profile("llamacpp").query == "q8_0" and get_profile("llamacpp").rotate
    with pytest.raises(QuantError, match="did you mean 'vllm-cpu'"):
        get_profile("vllm_cpu")
    with pytest.raises(QuantError, match="stores fp8_e4m3, fp8_e5m2"):
        profile_format("vllm-cpu", "nvfp4")


def test_spec_profile_key_parsed_refused_and_left_out_of_dumps_when_unset():
    spec = kv_spec_from_dict({"format": "fp8_e4m3", "profile": "vllm-cpu", "scales": "constant", "constant_scale": 1.0})
    with pytest.raises(QuantError, match="one k_scale = v_scale"):
        kv_spec_from_dict({"format": "fp8_e4m3", "profile": "vllm-cpu"})
    assert spec.profile == "vllm-cpu" and spec.model_dump()["profile"] == "vllm-cpu"
    plain = kv_spec_from_dict({"format": "nvfp4"})
    assert "profile" not in plain.model_dump() and "profile" not in plain.model_dump(mode="json")
    # only unset optional tables leave the dump (prefix_cache and scales_as_is do the same: old fingerprints stay)
    assert set(KVQuantSpec.model_fields) - set(plain.model_dump()) <= {
        "profile", "prefix_cache", "scales_as_is", "fp8_rounding", "query_format", "output_format"}
    with pytest.raises(QuantError, match="did you mean 'llamacpp'"):
        kv_spec_from_dict({"format": "q8_0", "profile": "llama.cpp"})
    with pytest.raises(QuantError, match="set profile = 'llamacpp'"):
        kv_spec_from_dict({"format": "q8_0"})
    with pytest.raises(QuantError, match="not 'nvfp4'"):
        kv_spec_from_dict({"format": "nvfp4", "profile": "vllm-cpu"})
    with pytest.raises(QuantError, match="no recent window"):
        kv_spec_from_dict({"format": "q8_0", "profile": "llamacpp", "recent_window": 16})
    with pytest.raises(QuantError, match="prefill reads the cache"):
        kv_spec_from_dict({"format": "q4_0", "profile": "llamacpp", "prefill_reads_quantized": False})
    with pytest.raises(QuantError, match="constant_scale = 1.0"):
        kv_spec_from_dict({"format": "nvfp4", "profile": "llamacpp"})
    ok = kv_spec_from_dict({"format": "nvfp4", "profile": "llamacpp", "scales": "constant", "constant_scale": 1})
    assert ok.layer_format(0) == "nvfp4"


def test_spec_fp8_rounding_query_and_output_format_without_a_profile():
    spec = kv_spec_from_dict({"format": "fp8_e4m3", "scales": "constant", "constant_scale": 1.0,
                              "fp8_rounding": "toward_zero", "query_format": "fp8_e4m3", "output_format": "fp8_e4m3"})
    fmt = spec_format(spec, 0)
    assert isinstance(fmt, FP8Format) and fmt.rounding == "toward_zero"
    # 1.1171875 lies above the midpoint of the E4M3 codes 1.0 and 1.125: nearest gives 1.125, truncation 1.0
    x = torch.tensor([1.1171875, -1.1171875])
    assert fmt.dequantize(fmt.quantize(x, torch.tensor(1.0))).tolist() == [1.0, -1.0]
    assert spec_format(kv_spec_from_dict({"format": "fp8_e4m3"}), 0).rounding == "nearest"
    assert spec.query_rounding() == "fp8_e4m3"
    assert kv_spec_from_dict({"format": "nvfp4", "profile": "flashinfer-nvfp4"}).query_rounding() == "fp8_e4m3"
    assert kv_spec_from_dict({"format": "nvfp4"}).query_rounding() == "none"
    assert {"fp8_rounding", "query_format", "output_format"} <= set(spec.model_dump())
    with pytest.raises(QuantError, match="decides how the engine rounds; drop query_format"):
        kv_spec_from_dict({"format": "nvfp4", "profile": "flashinfer-nvfp4", "query_format": "fp8_e4m3"})
    with pytest.raises(QuantError, match="output_format"):
        kv_spec_from_dict({"format": "none", "output_format": "fp8_e4m3"})


def test_query_and_output_format_round_the_hf_attention_to_fp8_e4m3():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from quant.kv.attention import profile_attention

    spec = kv_spec_from_dict({"format": "nvfp4", "query_format": "fp8_e4m3", "output_format": "fp8_e4m3"})
    name = profile_attention(spec)
    assert name is not None and profile_attention(kv_spec_from_dict({"format": "nvfp4"})) is None
    from transformers import AttentionInterface

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 16, generator=g) for _ in range(3))  # [B, H, n, D]
    module = torch.nn.Module()
    module.is_causal, module.training = True, False
    out, _ = AttentionInterface()[name](module, q, k, v, None, scaling=0.25)
    one = torch.ones(())
    q8 = fp8.dequantize(fp8.quantize(q, one, "e4m3"), one)
    ref, _ = sdpa_attention_forward(module, q8, k, v, None, scaling=0.25)
    assert torch.equal(out, fp8.dequantize(fp8.quantize(ref, one, "e4m3"), one))
    assert not torch.equal(out, sdpa_attention_forward(module, q, k, v, None, scaling=0.25)[0])
