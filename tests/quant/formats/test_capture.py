"""The capture-safe values-only rewrite (quant.formats.capture) against quant's references bit for bit, eager and
compiled, for every format; non-finite inputs written as its table says and counted."""

from __future__ import annotations

import pytest
import torch

from quant.errors import QuantError
from quant.formats import capture, nvfp4
from quant.formats.minifloat import F8_E4M3_MAX, F8_E5M2_MAX
from quant.formats.registry import FP8Format, NVFP4Format, get_format, quantize_dequantize

H, D = 3, 64
# every format the vLLM plugin rewrites, and FP8 with vLLM-CPU's truncating write (spec fp8_rounding)
FORMATS = {name: get_format(name) for name in
           ("none", "nvfp4", "nvfp4_4over6", "qa_mxfp4", "fp8_e4m3", "fp8_e5m2", "qa_int8", "qa_int4")}
FORMATS["fp8_e4m3_toward_zero"] = FP8Format(name="fp8_e4m3", kind="e4m3", rounding="toward_zero")
FP8_MAX = {"e4m3": F8_E4M3_MAX, "e5m2": F8_E5M2_MAX}
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _scales(fmt, per_head: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(K, V) decode scales: per head [H, 1] for K (V per tensor), or both per tensor; None when self-scaled."""
    if not fmt.needs_tensor_scale:
        return None, None
    k = torch.tensor([[0.002], [0.0107], [0.0431]]) if per_head else torch.tensor(0.003)
    return k, torch.tensor(0.0051)


def _inputs(t: int, dtype: torch.dtype, fmt, k_scale: torch.Tensor | None, seed: int) -> torch.Tensor:
    """x [T, H, D]: log-normal magnitudes, exact zeros of both signs, tiny values that round to -0, and the
    format's largest value (and above it) at K's scale."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, H, D, generator=g) * torch.exp(2 * torch.randn(t, H, 1, generator=g))
    if t:
        x[0, 0, :6] = torch.tensor([0.0, -0.0, -1e-30, 1e-30, -0.0, 0.0])
        peak = _peak(fmt, 1.0 if k_scale is None else k_scale.reshape(-1)[0].item())
        x[-1, 0, 16:20] = torch.tensor([peak, -peak, 1.5 * peak, -3 * peak])  # at and past the format's max
    return x.to(dtype)


def _peak(fmt, d: float) -> float:
    """The largest value fmt stores at decode scale d (head 0's)."""
    if isinstance(fmt, FP8Format):
        return FP8_MAX[fmt.kind] * d
    if isinstance(fmt, NVFP4Format):
        return nvfp4.NVFP4_AMAX * d
    return 48.0  # MXFP4: 6 * 2**3, the largest element at block scale 8; INT: any row amax


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit (-0.0 and +0.0 kept apart)."""
    bits = BITS[want.dtype]
    return got.dtype == want.dtype and got.shape == want.shape and torch.equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("per_head", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_eager_values_equal_the_reference_bit_for_bit(name, per_head, dtype):
    fmt = FORMATS[name]
    k_scale, v_scale = _scales(fmt, per_head)
    p = capture.prepare(fmt, k_scale, v_scale)
    for t in (0, 1, 2, 5):
        k, v = _inputs(t, dtype, fmt, k_scale, seed=t), _inputs(t, dtype, fmt, v_scale, seed=10 + t)
        got_k, n_k = capture.stream_values(p.family, p.static, k, p.k_const)
        got_v, n_v = capture.stream_values(p.family, p.static, v, p.v_const)
        assert _same(got_k, quantize_dequantize(fmt, k, k_scale, dtype)[1])
        assert _same(got_v, quantize_dequantize(fmt, v, v_scale, dtype)[1])
        assert int(n_k) == int(n_v) == 0


@pytest.mark.parametrize("name", list(FORMATS))
def test_compiled_pair_equals_the_reference_and_counts_nothing_on_finite_input(name):
    fmt = FORMATS[name]
    k_scale, v_scale = _scales(fmt, per_head=True)
    p = capture.prepare(fmt, k_scale, v_scale)
    bad = torch.zeros(1, dtype=torch.int64)
    for t in (5, 1, 3):  # a prefill, a decode step, an odd size (one compile serves 3 and 5)
        k = _inputs(t, torch.bfloat16, fmt, k_scale, seed=t)
        v = _inputs(t + 1, torch.bfloat16, fmt, v_scale, seed=20 + t)[1:, :2, :32]  # [T, 2, 32]: not contiguous
        got_k, got_v = capture.pair(p, k, v, bad)
        assert _same(got_k, quantize_dequantize(fmt, k, k_scale, k.dtype)[1])
        assert _same(got_v, quantize_dequantize(fmt, v.contiguous(), v_scale, v.dtype)[1])
    assert bad.tolist() == [0]


def _nonfinite_case(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x [2, H, D] bf16 with NaN at [0, 1, 5] and +Inf at [1, 2, 40], -Inf at [1, 0, 3]; and the same x with
    those three set to 0."""
    g = torch.Generator().manual_seed(7)
    clean = torch.randn(2, H, D, generator=g).to(torch.bfloat16)
    x = clean.clone()
    x[0, 1, 5], x[1, 2, 40], x[1, 0, 3] = float("nan"), float("inf"), float("-inf")
    clean[0, 1, 5] = clean[1, 2, 40] = clean[1, 0, 3] = 0
    return x, clean


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("compiled", [False, True])
def test_non_finite_values_are_written_as_the_table_says_and_counted(name, compiled, monkeypatch):
    if not compiled:
        monkeypatch.setenv("QA_KV_COMPILED", "0")
    fmt = FORMATS[name]
    k_scale, v_scale = _scales(fmt, per_head=True)
    p = capture.prepare(fmt, k_scale, v_scale)
    x, clean = _nonfinite_case(name)
    bad = torch.tensor([5])
    # V clean, shaped and strided as in the compiled-pair test above: compiled, the call reuses its graph
    v = _inputs(3, torch.bfloat16, fmt, v_scale, seed=23)[1:, :2, :32]
    got, _ = capture.pair(p, x, v, bad)
    assert bad.tolist() == [5 + 3]  # added in place: NaN, +Inf, -Inf of K (V is clean)
    ref = quantize_dequantize(fmt, clean, k_scale, x.dtype)[1].float()
    got = got.float()
    family, group = p.family, {"nvfp4": 16, "nvfp4_4over6": 16, "mxfp4": 32, "int": D}.get(p.family, 1)
    hit = torch.zeros(2, H, D // group, dtype=torch.bool)  # the scaling groups holding a non-finite value
    hit[0, 1, 5 // group] = hit[1, 2, 40 // group] = hit[1, 0, 3 // group] = True
    hit = hit.repeat_interleave(group, dim=-1)
    assert torch.equal(got[~hit], ref[~hit])  # every other group as the reference writes it
    assert got[0, 1, 5].isnan()  # NaN in, NaN out
    nan_group = torch.zeros_like(hit)
    nan_group[0, 1, (5 // group) * group:(5 // group + 1) * group] = True
    if family in ("nvfp4", "nvfp4_4over6", "mxfp4", "int"):
        assert got[nan_group].isnan().all()  # the group's scale is NaN
    inf = got[1, 2, 40], got[1, 0, 3]
    if family in ("fp8", "nvfp4", "nvfp4_4over6"):
        if family == "fp8":  # saturated: +-fp8_max * d
            top = torch.tensor(FP8_MAX[fmt.kind]) * k_scale[:, 0]
        else:  # +-(6 * 448) * (1/gs)
            top = torch.tensor(6.0 * 448.0) * torch.reciprocal(nvfp4.global_scale_from_decode_scale(k_scale[:, 0]))
        top = top.to(torch.bfloat16).float()  # [H]
        assert inf[0] == top[2] and inf[1] == -top[0]
    elif family == "int":
        assert got[1, 2].isnan().all() and got[1, 0].isnan().all()  # the rows' scales are Inf
    else:  # none, mxfp4
        assert inf[0] == float("inf") and inf[1] == float("-inf")


def test_scales_are_checked_once_when_prepared():
    with pytest.raises(QuantError, match="positive and finite"):
        capture.prepare(get_format("fp8_e4m3"), torch.tensor([[0.01], [0.0], [1.0]]), torch.tensor(1.0))
    with pytest.raises(QuantError, match="1/d in"):
        capture.prepare(get_format("nvfp4"), torch.tensor(float("nan")), torch.tensor(1.0))
    with pytest.raises(QuantError, match="decode scale for K and for V"):
        capture.prepare(get_format("nvfp4"), None, None)
    p = capture.prepare(get_format("qa_int4"), None, None)
    with pytest.raises(QuantError, match="D % 2 == 0"):
        capture.pair(p, torch.randn(2, 1, 7), torch.randn(2, 1, 8))
    assert capture.prepare(get_format("nvfp4"), torch.tensor(0.5), torch.tensor(0.25)).k_const.item() == 2.0
