"""MXFP4: hand-computed scales and codes, and bit-exactness against torchao's MX reference."""

from __future__ import annotations

import pytest
import torch

from quant.errors import QuantError
from quant.formats import mxfp4
from quant.formats.minifloat import unpack_nibbles


def test_hand_computed_block() -> None:
    """amax 7 -> floor(log2 7) - 2 = 0 -> scale 1 (byte 127); 7 saturates to 6, ties go to even."""
    x = torch.tensor([[7.0, -0.25, 0.75, 2.5, 5.0, -3.5] + [0.0] * 26])
    q = mxfp4.quantize(x)
    assert q.scales.tolist() == [[127]]
    assert unpack_nibbles(q.packed)[0, :6].tolist() == [7, 8, 2, 4, 6, 14]
    assert mxfp4.dequantize(q)[0, :6].tolist() == [6.0, -0.0, 1.0, 2.0, 4.0, -4.0]


def test_power_of_two_scale_per_block() -> None:
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 32] = 1.0, 1000.0  # floor(log2(1000)) = 9 -> 2**7, byte 134
    q = mxfp4.quantize(x)
    assert q.scales.tolist() == [[125, 134]]
    # 1000 / 128 = 7.8 clips to 6: MXFP4's floor scale loses the top of the binade (6 * 128 = 768)
    assert mxfp4.dequantize(q)[0, [0, 32]].tolist() == [1.0, 768.0]


def test_shape_and_nan_errors() -> None:
    with pytest.raises(QuantError, match="multiple of 32"):
        mxfp4.quantize(torch.ones(2, 16))
    x = torch.ones(1, 32)
    x[0, 5] = float("inf")
    with pytest.raises(QuantError, match="NaN or Inf"):
        mxfp4.quantize(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bit_exact_against_torchao(dtype: torch.dtype) -> None:
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 256, generator=g) * torch.logspace(-30, 30, 256)  # every binade, per block
    x[0, :32] = 0.0
    x[1, :32] = -0.0
    x[2, :32] = 1e-40  # subnormal amax: byte 0, divide by 2**-126
    x[3, :8] = torch.tensor([6.0, 8.0, 7.0, 5.0, 3.5, 2.5, 0.25, 0.75]) * 2.0**-3  # ties and clipping
    x = x.to(dtype)
    scale_ref, data_ref = mx.to_mx(x, torch.float4_e2m1fn_x2, 32)
    q = mxfp4.quantize(x)
    assert torch.equal(q.scales, scale_ref.view(torch.uint8))
    assert torch.equal(q.packed, data_ref.view(torch.uint8))
    ref = mx.to_dtype(data_ref, scale_ref, torch.float4_e2m1fn_x2, 32, torch.float32)
    assert torch.equal(mxfp4.dequantize(q).view(torch.int32), ref.reshape(x.shape).view(torch.int32))
