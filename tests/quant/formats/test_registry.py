"""The KVFormat registry: names, sizes, scales, round-trip SQNR bounds and properties of every format."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quant.errors import QuantError
from quant.formats import nvfp4
from quant.formats.catalog import VLLM_FORMATS
from quant.formats.registry import FORMAT_NAMES, QuantizedTensor, get_format
from quant.kv.spec import kv_spec_from_dict

EXPECTED_NAMES = ("none", "nvfp4", "nvfp4_4over6", "qa_mxfp4", "fp8_e4m3", "fp8_e5m2", "qa_int8", "qa_int4")
QUANTIZED = tuple(n for n in EXPECTED_NAMES if n != "none")

# SQNR (dB) of one round trip on the fixed tensors below, measured once; the bounds sit ~1 dB under
# (a regression) and 4 dB over (a quantizer that silently stopped quantizing).
SQNR_RANDOM = {
    "nvfp4": 20.4, "nvfp4_4over6": 21.2, "qa_mxfp4": 18.8, "fp8_e4m3": 31.5, "fp8_e5m2": 25.6,
    "qa_int8": 43.8, "qa_int4": 18.6,
}
SQNR_OUTLIER = {
    "nvfp4": 23.9, "nvfp4_4over6": 24.0, "qa_mxfp4": 16.6, "fp8_e4m3": 33.5, "fp8_e5m2": 25.1,
    "qa_int8": 33.8, "qa_int4": 17.7,
}


def _kv(kind: str) -> torch.Tensor:
    """[tokens=64, heads=8, head_dim=128]; `outlier`: 3 channels x50 and a log-normal scale per token-head."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, 128, generator=g)
    if kind == "outlier":
        x[..., torch.tensor([3, 77, 100])] *= 50.0
        x = x * torch.exp(torch.randn(64, 8, 1, generator=g))
    return x


def _sqnr_db(x: torch.Tensor, y: torch.Tensor) -> float:
    return 10 * math.log10(float(x.double().square().sum() / (y.double() - x.double()).square().sum()))


def test_registry_names() -> None:
    assert FORMAT_NAMES == EXPECTED_NAMES + VLLM_FORMATS  # vLLM's own: tests/quant/formats/test_vllm_kv_formats.py
    for name in FORMAT_NAMES:
        assert get_format(name).name == name


@pytest.mark.parametrize(("typo", "suggestion"), [("nvpf4", "nvfp4"), ("fp8", "fp8_e4m3"), ("QA_INT8", "qa_int8")])
def test_unknown_name_did_you_mean(typo: str, suggestion: str) -> None:
    with pytest.raises(QuantError, match=f"did you mean '{suggestion}'"):
        get_format(typo)


@pytest.mark.parametrize(("old", "line"), [
    ("int8", "KV format 'int8' is now called 'qa_int8' (the toolkit's own format, not vLLM's int8_per_token_head)"),
    ("INT4", "KV format 'INT4' is now called 'qa_int4' (the toolkit's own format, not vLLM's int4_per_token_head)"),
    ("mxfp4", "KV format 'mxfp4' is now called 'qa_mxfp4' (the toolkit's own format, not a vLLM KV format)"),
])
def test_the_toolkits_own_formats_old_names_are_refused_naming_the_new(old: str, line: str) -> None:
    with pytest.raises(QuantError) as err:
        get_format(old)
    assert str(err.value) == line
    with pytest.raises(QuantError) as err:
        kv_spec_from_dict({"format": "nvfp4", "layer_formats": {1: old}})
    assert str(err.value) == f"kv cache spec: layer_formats: {line}"


def test_unknown_name_without_close_match_lists_all() -> None:
    with pytest.raises(QuantError, match="choose one of: none, nvfp4"):
        get_format("zzzzzz")


def test_none_is_bit_exact() -> None:
    x = torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    fmt = get_format("none")
    q = fmt.quantize(x)
    assert q.nbytes() == x.numel() * 2 and q.scale is None
    assert torch.equal(fmt.dequantize(q, torch.bfloat16), x)
    assert torch.equal(fmt.dequantize(q), x.float())


@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize(("kind", "table"), [("random", SQNR_RANDOM), ("outlier", SQNR_OUTLIER)])
def test_round_trip_sqnr_bounds(name: str, kind: str, table: dict[str, float]) -> None:
    x = _kv(kind)
    fmt = get_format(name)
    y = fmt.dequantize(fmt.quantize(x))
    assert y.shape == x.shape and y.dtype == torch.float32
    assert table[name] - 1.0 < _sqnr_db(x, y) < table[name] + 4.0


def test_4over6_beats_nvfp4_on_random_data() -> None:
    x = _kv("random")
    err = {n: _sqnr_db(x, get_format(n).dequantize(get_format(n).quantize(x))) for n in ("nvfp4", "nvfp4_4over6")}
    assert err["nvfp4_4over6"] > err["nvfp4"]


@pytest.mark.parametrize(
    ("name", "bytes_per_token_head"),
    [("nvfp4", 64 + 8), ("nvfp4_4over6", 72), ("qa_mxfp4", 64 + 4), ("fp8_e4m3", 128), ("fp8_e5m2", 128),
     ("qa_int8", 128 + 4), ("qa_int4", 64 + 4)],
)
def test_nbytes_and_bits_per_element(name: str, bytes_per_token_head: int) -> None:
    x = _kv("random")  # 64 tokens x 8 heads x head_dim 128
    fmt = get_format(name)
    q = fmt.quantize(x)
    scale_bytes = 4 if fmt.needs_tensor_scale else 0  # one float32 decode scale per tensor
    assert q.nbytes() == 64 * 8 * bytes_per_token_head + scale_bytes
    assert fmt.bits_per_element == bytes_per_token_head * 8 / 128
    assert q.format == name and q.shape == (64, 8, 128)


def test_needs_tensor_scale_flags() -> None:
    flags = {n: get_format(n).needs_tensor_scale for n in FORMAT_NAMES}
    assert [n for n, f in flags.items() if f] == ["nvfp4", "nvfp4_4over6", "fp8_e4m3", "fp8_e5m2"]


def test_nvfp4_format_uses_the_decode_scale_convention() -> None:
    x = _kv("outlier")
    d = torch.tensor(0.0123)
    q = get_format("nvfp4").quantize(x, d)
    ref = nvfp4.quantize(x, global_scale=1.0 / d)  # gs = fl32(1/d)
    assert torch.equal(q.data["packed"], ref.packed) and torch.equal(q.data["scales"], ref.scales)
    assert torch.equal(get_format("nvfp4").dequantize(q), nvfp4.dequantize(ref))
    assert q.scale is not None and q.scale.item() == d.item()


def test_dynamic_decode_scales() -> None:
    x = _kv("random")
    amax = x.abs().amax()
    assert get_format("nvfp4").quantize(x).scale.item() == (amax / 2688).item()  # type: ignore[union-attr]
    assert get_format("fp8_e4m3").quantize(x).scale.item() == (amax / 448).item()  # type: ignore[union-attr]
    assert get_format("fp8_e5m2").quantize(x).scale.item() == (amax / 57344).item()  # type: ignore[union-attr]
    assert get_format("fp8_e4m3").decode_scale_from_amax(torch.tensor(0.0)).item() == 1.0


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_4over6", "fp8_e4m3", "fp8_e5m2"])
def test_per_head_scale_equals_per_head_slices(name: str) -> None:
    x = _kv("outlier").permute(1, 0, 2).unsqueeze(0).contiguous()  # [1, H=8, T=64, D=128]
    fmt = get_format(name)
    amax = x.abs().amax(dim=(0, 2, 3), keepdim=True)  # [1, 8, 1, 1]
    d = fmt.decode_scale_from_amax(amax)
    y = fmt.dequantize(fmt.quantize(x, d))
    for h in range(8):
        yh = fmt.dequantize(fmt.quantize(x[:, h], d[0, h, 0, 0]))
        assert torch.equal(y[:, h], yh), h


def test_scale_of_wrong_shape_is_rejected() -> None:
    with pytest.raises(QuantError, match="does not broadcast"):
        get_format("fp8_e4m3").quantize(torch.ones(2, 8, 4, 32), torch.ones(3, 1, 1))


def test_dequantize_with_the_wrong_format_is_rejected() -> None:
    q = get_format("qa_int8").quantize(torch.ones(2, 32))
    with pytest.raises(QuantError, match="cannot dequantize a 'qa_int8' tensor"):
        get_format("qa_int4").dequantize(q)


@pytest.mark.parametrize("name", QUANTIZED)
def test_non_finite_input_raises(name: str) -> None:
    x = torch.ones(2, 64)
    x[1, 3] = float("nan")
    with pytest.raises(QuantError, match="NaN or Inf"):
        get_format(name).quantize(x)


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_output_dtype(name: str) -> None:
    fmt = get_format(name)
    y = fmt.dequantize(fmt.quantize(torch.randn(2, 64)), torch.bfloat16)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 64)


# --- properties over every format -----------------------------------------------------------------


@st.composite
def kv_rows(draw: st.DrawFn) -> torch.Tensor:
    vals = draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=64, max_size=64))
    return torch.tensor(vals, dtype=torch.float32).reshape(1, 64)


@settings(max_examples=40, deadline=None)
@given(kv_rows(), st.sampled_from(QUANTIZED))
def test_finite_input_gives_finite_output(x: torch.Tensor, name: str) -> None:
    fmt = get_format(name)
    q = fmt.quantize(x)
    assert isinstance(q, QuantizedTensor)
    assert torch.isfinite(fmt.dequantize(q)).all()


@settings(max_examples=40, deadline=None)
@given(kv_rows(), st.sampled_from(["nvfp4", "nvfp4_4over6", "fp8_e4m3", "fp8_e5m2"]))
def test_static_scale_saturates_at_the_range_end(x: torch.Tensor, name: str) -> None:
    """With decode scale 1, nothing exceeds the format's largest value (2688 NVFP4, 448/57344 FP8)."""
    fmt = get_format(name)
    top = {"nvfp4": 2688.0, "nvfp4_4over6": 2688.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}[name]
    y = fmt.dequantize(fmt.quantize(x, torch.tensor(1.0)))
    assert y.abs().max() <= top
    big = x.abs() >= 2 * top
    assert (y[big].abs() == top).all()  # saturated, not wrapped or NaN
    assert (y[big].sign() == x[big].sign()).all()
