"""Symmetric INT8 / INT4 with one float32 scale per row of the last dimension (per token and KV head).

scale = amax_row / qmax with qmax = 2**(bits-1) - 1 (127 or 7; the range is symmetric, -128 / -8
unused); q = round_half_to_even(x / scale) clamped to [-qmax, qmax]; x^ = q * scale. An all-zero row
stores scale 0 and codes 0. INT4 codes are packed two per byte as two's-complement nibbles, element
2i in the low nibble.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from quant.errors import QuantError
from quant.formats.fp8 import check_finite
from quant.formats.minifloat import pack_nibbles, unpack_nibbles

IntBits = Literal[8, 4]


def qmax(bits: IntBits) -> int:
    """Largest code magnitude of the symmetric range: 127 for INT8, 7 for INT4."""
    return 2 ** (bits - 1) - 1


@dataclass(frozen=True)
class IntTensor:
    """Symmetric integer codes with one float32 scale per row."""

    codes: torch.Tensor  # int8 [..., D] (INT8) or uint8 [..., D/2] packed nibbles (INT4)
    scales: torch.Tensor  # float32 [..., 1]: decode scale amax_row / qmax
    bits: IntBits


def quantize(x: torch.Tensor, bits: IntBits) -> IntTensor:
    """Quantize x [..., D] per row of the last dimension; INT4 needs an even D."""
    check_finite(x, f"INT{bits}")
    if x.dim() == 0 or (bits == 4 and x.shape[-1] % 2):
        raise QuantError(f"INT{bits} needs a tensor with an even last dimension, got {tuple(x.shape)}")
    xf = x.to(torch.float32)
    scales = xf.abs().amax(dim=-1, keepdim=True) / qmax(bits)  # [..., 1]
    safe = torch.where(scales > 0, scales, 1.0)  # zero rows: 0 / 1 -> codes 0
    q = torch.round(xf / safe).clamp_(-qmax(bits), qmax(bits)).to(torch.int8)  # torch.round: half to even
    codes = pack_nibbles(q.view(torch.uint8) & 0x0F) if bits == 4 else q
    return IntTensor(codes=codes, scales=scales, bits=bits)


def dequantize(q: IntTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values code * scale of q [..., D], computed in float32, returned in `dtype`."""
    if q.bits == 4:
        nibbles = unpack_nibbles(q.codes).to(torch.int8)  # 0..15
        codes = torch.where(nibbles > 7, nibbles - 16, nibbles)  # two's complement nibble -> -8..7
    else:
        codes = q.codes
    return (codes.to(torch.float32) * q.scales).to(dtype)
