"""ggml's q8_0 / q4_0 blocks against the reference formulas written out per block, and the Hadamard rotation."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
import torch

from quant.errors import QuantError
from quant.formats.ggml_blocks import (
    GGML_FORMATS,
    dequantize_q4_0,
    dequantize_q8_0,
    hadamard,
    quantize_q4_0,
    quantize_q8_0,
    rotate,
    round_matmul_inputs,
    round_q8_0,
)


def _x(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 3


def _q8_0_block(block: list[float]) -> tuple[list[int], float]:
    """quantize_row_q8_0_ref for one block of 32, in float32 as ggml computes it."""
    f = np.float32
    amax = max(abs(f(v)) for v in block)
    d = f(amax) / f(127)
    inv = f(1) / d if d else f(0)
    codes = [int(math.copysign(math.floor(abs(float(f(v) * inv)) + 0.5), float(v))) for v in block]
    return codes, float(np.float16(d))


def _q4_0_block(block: list[float]) -> tuple[list[int], float]:
    """quantize_row_q4_0_ref for one block of 32 (nibbles 0..15, before packing)."""
    f = np.float32
    amax, mx = f(0), f(0)
    for v in block:
        if abs(f(v)) > amax:
            amax, mx = abs(f(v)), f(v)
    d = mx / f(-8)
    inv = f(1) / d if d else f(0)
    codes = [min(15, int(f(v) * inv + f(8.5))) for v in block]
    return codes, float(np.float16(d))


def test_q8_0_matches_the_reference_formula_block_by_block():
    x = _x((3, 64))
    codes, scales = quantize_q8_0(x, simd=False)
    for r in range(3):
        for b in range(2):
            want_codes, want_d = _q8_0_block(x[r, 32 * b: 32 * (b + 1)].tolist())
            assert codes[r, 32 * b: 32 * (b + 1)].tolist() == want_codes
            assert float(scales[r, b]) == want_d
    values = dequantize_q8_0(codes, scales)
    assert torch.equal(values, codes.float() * scales.float().repeat_interleave(32, dim=-1))
    assert int(codes.abs().max()) == 127


def test_q4_0_matches_the_reference_formula_and_packs_element_j_low_j_plus_16_high():
    x = _x((2, 64), seed=1)
    packed, scales = quantize_q4_0(x)
    assert packed.shape == (2, 32) and scales.shape == (2, 2)
    for r in range(2):
        for b in range(2):
            want, want_d = _q4_0_block(x[r, 32 * b: 32 * (b + 1)].tolist())
            got = packed[r, 16 * b: 16 * (b + 1)]
            assert [int(v) & 0x0F for v in got] == want[:16]
            assert [int(v) >> 4 for v in got] == want[16:]
            assert float(scales[r, b]) == want_d
            values = dequantize_q4_0(packed[r, 16 * b: 16 * (b + 1)], scales[r, b: b + 1])
            assert values.tolist() == [(q - 8) * want_d for q in want]


def test_q4_0_puts_the_largest_magnitude_on_code_minus_8_and_zeros_stay_zero():
    x = torch.zeros(1, 32)
    x[0, 5] = -2.0
    x[0, 7] = 1.0
    packed, scales = quantize_q4_0(x)
    values = dequantize_q4_0(packed, scales)
    assert float(values[0, 5]) == -2.0 and float(values[0, 7]) == 1.0
    assert float(values[0, 0]) == 0.0
    zeros_p, zeros_s = quantize_q4_0(torch.zeros(1, 32))
    assert torch.equal(dequantize_q4_0(zeros_p, zeros_s), torch.zeros(1, 32))


def test_block_formats_refuse_head_dims_off_the_block_and_non_finite_input():
    with pytest.raises(QuantError, match="multiple of 32"):
        quantize_q8_0(torch.ones(1, 48))
    with pytest.raises(QuantError, match="NaN or Inf"):
        quantize_q4_0(torch.full((1, 32), float("nan")))


def test_formats_round_trip_with_their_error_bound():
    x = _x((4, 2, 5, 64), seed=2)
    # q8_0: half a step; q4_0: a full step (codes -8..7 clip the side opposite the largest magnitude at 7 d)
    for name, steps, half in (("q8_0", 127, 0.5), ("q4_0", 8, 1.0)):
        fmt = GGML_FORMATS[name]
        q = fmt.quantize(x)
        y = fmt.dequantize(q, torch.float32)
        amax = x.reshape(*x.shape[:-1], 2, 32).abs().amax(-1, keepdim=True)
        err = (y - x).reshape(*x.shape[:-1], 2, 32).abs()
        # plus the fp16 rounding of d (relative 2**-11) times the largest code
        assert bool((err <= amax / steps * (half + steps * 2**-10)).all()), name


def test_hadamard_is_orthonormal_symmetric_and_rotation_is_an_involution():
    h = hadamard(64)
    assert torch.allclose(h @ h.T, torch.eye(64), atol=1e-6)
    assert torch.equal(h, h.T)
    assert set((h * 8).round().unique().tolist()) == {-1.0, 1.0}
    x = _x((3, 64), seed=3)
    assert torch.allclose(rotate(rotate(x)), x, atol=1e-5)
    with pytest.raises(QuantError, match="power-of-two"):
        hadamard(48)


def test_round_q8_0_is_quantize_then_dequantize():
    x = _x((2, 32), seed=4)
    codes, scales = quantize_q8_0(x)
    assert torch.equal(round_q8_0(x), dequantize_q8_0(codes, scales))


def _ggml_bytes(kind: str, x: np.ndarray, simd: bool = False) -> np.ndarray:
    """Our blocks of x [N, D] laid out as ggml stores them: per block fp16 d, then the 32 codes (q8_0) or 16 nibble bytes."""
    t = torch.from_numpy(x)
    codes, scales = quantize_q8_0(t, simd=simd) if kind == "q8_0" else quantize_q4_0(t)
    n = x.size // 32
    d = scales.numpy().reshape(n, 1).view(np.uint8)
    return np.concatenate([d, codes.numpy().reshape(n, -1).view(np.uint8)], axis=1).reshape(x.shape[0], -1)


def _kv_like_and_edge_rows() -> np.ndarray:
    """K/V-like rows of 64 (normal, scaled, heavy-tailed, outlier channels, bf16-valued) and edge-case blocks."""
    rng = np.random.default_rng(0)
    outliers = rng.standard_normal((64, 64))
    outliers[:, [3, 40]] *= 30
    edge = np.zeros((6, 64))
    edge[1, 5], edge[1, 7] = -2.0, 1.0  # largest magnitude negative
    edge[2, :32] = np.linspace(-1, 1, 32)  # -1 and 1 tie in magnitude: the first one sets d
    edge[3, :32], edge[3, 32:] = 1.0, -1.0  # all equal
    edge[4, :32] = (np.arange(32) - 16) * 0.25 + 0.125  # points halfway between q4_0 codes
    edge[5, :32] = 1e-30 * np.arange(32)  # tiny (row 0 stays all zero)
    bf16 = torch.from_numpy(rng.standard_normal((64, 64)).astype(np.float32)).bfloat16().float().numpy()
    rows = (rng.standard_normal((64, 64)), 37 * rng.standard_normal((64, 64)), rng.standard_t(3, (64, 64)),
            rng.standard_cauchy((64, 64)), outliers, bf16, edge)
    return np.ascontiguousarray(np.concatenate(rows), dtype=np.float32)


@pytest.mark.parametrize(("kind", "qtype"), [("q4_0", gguf.GGMLQuantizationType.Q4_0),
                                             ("q8_0", gguf.GGMLQuantizationType.Q8_0)])
def test_q4_0_and_reference_q8_0_are_bit_exact_with_gguf(kind, qtype):
    x = _kv_like_and_edge_rows()
    want = gguf.quants.quantize(x, qtype)
    assert np.array_equal(_ggml_bytes(kind, x), want)
    t = torch.from_numpy(x)
    values = dequantize_q8_0(*quantize_q8_0(t, simd=False)) if kind == "q8_0" else dequantize_q4_0(*quantize_q4_0(t))
    assert np.array_equal(values.numpy(), gguf.quants.dequantize(want, qtype))


def test_q8_0_rounds_as_the_x86_kernel_does_by_default():
    # x86 quantize_row_q8_0: x * (127 / amax) rounded half to even; the reference: x * (1 / (amax / 127)), roundf
    tie = np.zeros((1, 32), np.float32)
    tie[0, :4] = [127.0, 2.5, -2.5, 3.5]  # exact ties (id = 1): even vs away from zero
    inv = np.zeros((1, 32), np.float32)
    inv[0, 0], inv[0, 1] = float.fromhex("0x1.6a1f3ap+1"), float.fromhex("0x1.39a622p-1")
    # x * (127 / amax) = 27.499998 but x * (1 / (amax / 127)) = 27.500002 in float32
    div = np.zeros((1, 32), np.float32)
    div[0, 0], div[0, 1] = float.fromhex("0x1.2f4ba4p+1"), float.fromhex("-0x1.5a4842p+0")
    # 127 / amax divided in float32: x * it = -72.500008; 127 * (1 / amax) would give -72.5, rounded to -72
    cases = ((tie, [127, 2, -2, 4], [127, 3, -3, 4]), (inv, [127, 27], [127, 28]), (div, [127, -73], [127, -73]))
    for x, simd_codes, ref_codes in cases:
        n = len(simd_codes)
        assert quantize_q8_0(torch.from_numpy(x))[0][0, :n].tolist() == simd_codes
        assert quantize_q8_0(torch.from_numpy(x), simd=False)[0][0, :n].tolist() == ref_codes
        ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)[0, 2:2 + n].view(np.int8)
        assert ref.tolist() == ref_codes  # gguf's quantizer is the reference
        fmt = GGML_FORMATS["q8_0"]
        assert fmt.quantize(torch.from_numpy(x)).data["codes"][0, :n].tolist() == simd_codes  # the cache write
        d = float(quantize_q8_0(torch.from_numpy(x))[1][0, 0])
        assert round_q8_0(torch.from_numpy(x))[0, :n].tolist() == [c * d for c in simd_codes]  # Q
    # on K/V-like float32 rows the two differ rarely, by one code, with the same scales
    x = _kv_like_and_edge_rows()
    simd, ref = quantize_q8_0(torch.from_numpy(x)), quantize_q8_0(torch.from_numpy(x), simd=False)
    assert torch.equal(simd[1], ref[1])
    diff = (simd[0].int() - ref[0].int()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 1e-2


def test_round_matmul_inputs_rounds_every_linear_input_until_removed():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32, bias=False))
    x = _x((3, 64), seed=5)
    plain = model(x)
    handles = round_matmul_inputs(model)
    assert len(handles) == 2
    first = torch.nn.functional.linear(round_q8_0(x), model[0].weight, model[0].bias)
    want = torch.nn.functional.linear(round_q8_0(torch.relu(first)), model[2].weight)
    assert torch.equal(model(x), want) and not torch.equal(want, plain)
    for h in handles:
        h.remove()
    assert torch.equal(model(x), plain)
