"""ggml's q8_0 / q4_0 blocks against the reference formulas written out per block, and the Hadamard rotation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from quant.errors import QuantError
from quant.ggml_blocks import (
    GGML_FORMATS,
    dequantize_q4_0,
    dequantize_q8_0,
    hadamard,
    quantize_q4_0,
    quantize_q8_0,
    rotate,
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
    codes, scales = quantize_q8_0(x)
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
