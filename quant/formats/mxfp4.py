"""MXFP4 (OCP Microscaling spec v1.0): FP4 E2M1 elements in blocks of 32, one E8M0 power-of-two scale each.

The scale of a block is X = 2**(floor(log2(amax_block)) - 2), where 2 = floor(log2(6)) is the largest
E2M1 exponent (spec sec. 6.3, "minimally supported" conversion); there is no second-level scale.
Elements are x / X rounded to nearest-even E2M1, saturating at 6, so a block's largest element may
clip (amax in [6X, 8X)). Bit-exact with torchao's `to_mx(..., torch.float4_e2m1fn_x2, 32)` in its
default FLOOR mode, including its corner cases: an all-zero or subnormal-amax block gets scale byte 0
(2**-127), divides by the smallest normal 2**-126 and dequantizes with 2**-127; -0.0 keeps its sign
(code 8). 4 + 8/32 = 4.25 bits per element.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quant.errors import QuantError
from quant.formats.minifloat import E8M0_BIAS, e2m1_decode_packed, e2m1_encode, e8m0_from_bytes, pack_nibbles

BLOCK_SIZE = 32  # OCP MX block size
F4_E2M1_EMAX = 2  # floor(log2(6.0)): exponent of the largest E2M1 value
F32_MIN_NORMAL = 2.0**-126  # torchao divides by at least this (its 2**-127 is subnormal)
_F32_MANTISSA_BITS = 23


@dataclass(frozen=True)
class MXFP4Tensor:
    """An MXFP4-quantized tensor: packed E2M1 codes and raw E8M0 block-scale bytes."""

    packed: torch.Tensor  # uint8 [..., K/2]: element 2i in the low nibble
    scales: torch.Tensor  # uint8 [..., K/32]: E8M0 bytes, scale = 2**(byte - 127)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the original tensor [..., K]."""
        return (*self.packed.shape[:-1], self.packed.shape[-1] * 2)


def quantize(x: torch.Tensor) -> MXFP4Tensor:
    """Quantize x [..., K] (K % 32 == 0) to MXFP4; raises QuantError on NaN/Inf or a bad shape."""
    if not x.is_floating_point() or x.dim() == 0 or x.shape[-1] % BLOCK_SIZE:
        raise QuantError(
            f"MXFP4 needs a floating-point tensor whose last dimension is a multiple of {BLOCK_SIZE}, "
            f"got {x.dtype} {tuple(x.shape)}"
        )
    xf = x.to(torch.float32)
    blocks = xf.reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)  # [..., K/32, 32]
    amax = blocks.abs().amax(dim=-1)  # [..., K/32]
    if not bool(torch.isfinite(amax).all()):
        raise QuantError("input holds NaN or Inf: a KV cache with non-finite values is a model bug")
    # floor(log2(amax)) is the unbiased float32 exponent field (-127 for zero and subnormals)
    exponent = (amax.view(torch.int32) >> _F32_MANTISSA_BITS) - E8M0_BIAS  # [..., K/32]
    biased = (exponent - F4_E2M1_EMAX).clamp(min=-E8M0_BIAS, max=E8M0_BIAS) + E8M0_BIAS
    scales = biased.to(torch.uint8)
    divisor = e8m0_from_bytes(scales).clamp(min=F32_MIN_NORMAL)  # powers of two: x / X is exact-or-RNE
    codes = e2m1_encode(blocks / divisor.unsqueeze(-1), sign_from_bit=True)  # [..., K/32, 32]
    return MXFP4Tensor(packed=pack_nibbles(codes.reshape(x.shape)), scales=scales)


def dequantize(q: MXFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of q [..., K] in `dtype`: E2M1 value * 2**(byte - 127), in float32."""
    values = e2m1_decode_packed(q.packed)  # [..., K]
    values = values.reshape(*values.shape[:-1], values.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)  # [..., K/32, 32]
    values = values.mul_(e8m0_from_bytes(q.scales).unsqueeze(-1))
    return values.reshape(q.shape).to(dtype)
