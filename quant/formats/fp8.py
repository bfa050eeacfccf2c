"""FP8 KV cache (E4M3 / E5M2) with one decode scale per tensor or per head, as vLLM's `fp8` KV cache.

q = fp8(x / d), saturating at the format's largest finite value (448 for E4M3, 57344 for E5M2):
torch's own RNE cast after a clamp (torch 2.13 saturates E4M3 on CPU but not E5M2, so we clamp both).
x^ = float(q) * d. The decode scale d is a checkpoint `k_scale` (amax / fp8_max after calibration);
vLLM uses d = 1.0 when none is calibrated.
"""

from __future__ import annotations

from typing import Literal

import torch

from quant.errors import QuantError
from quant.formats.catalog import FP8Rounding  # how x / d becomes a code: nearest-even or truncated
from quant.formats.minifloat import F8_E4M3_MAX, F8_E5M2_MAX

FP8Kind = Literal["e4m3", "e5m2"]
FP8_DTYPES: dict[str, torch.dtype] = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_MAX: dict[str, float] = {"e4m3": F8_E4M3_MAX, "e5m2": F8_E5M2_MAX}


def check_finite(x: torch.Tensor, what: str) -> None:
    """Raise QuantError if x holds NaN or Inf (a KV cache holding them is a model bug)."""
    if not bool(torch.isfinite(x).all()):
        raise QuantError(f"{what} input holds NaN or Inf: a KV cache with non-finite values is a model bug")


def decode_scale_from_amax(amax: torch.Tensor, kind: FP8Kind) -> torch.Tensor:
    """Decode scale d = amax / fp8_max (float32); 1.0 where amax == 0."""
    amax = amax.to(torch.float32)
    return torch.where(amax > 0, amax / FP8_MAX[kind], 1.0)


def quantize(x: torch.Tensor, decode_scale: torch.Tensor, kind: FP8Kind,
             rounding: FP8Rounding = "nearest") -> torch.Tensor:
    """FP8 tensor fp8(x / d) of x [..., D], saturating; d is float32, shape () or broadcastable to x.
    `toward_zero`: fp8(x * fl32(1/d)) truncated (vLLM-CPU's `x * k_inv` then dropped mantissa bits)."""
    check_finite(x, f"FP8 {kind}")
    d = decode_scale.to(device=x.device, dtype=torch.float32)
    if not bool(((d > 0) & torch.isfinite(d)).all()):
        raise QuantError(f"FP8 decode scale must be positive and finite, got {d.flatten()[:4].tolist()}")
    fp8_max = FP8_MAX[kind]
    if rounding == "nearest":
        return (x.to(torch.float32) / d).clamp(-fp8_max, fp8_max).to(FP8_DTYPES[kind])
    y = (x.to(torch.float32) * (1.0 / d)).clamp(-fp8_max, fp8_max)
    q = y.to(FP8_DTYPES[kind])
    # sign-magnitude codes: where nearest rounding moved away from zero, the code one below is the
    # truncated value (also across a binade: code - 1 is the next smaller magnitude)
    up = q.to(torch.float32).abs() > y.abs()
    codes = q.view(torch.uint8)
    return torch.where(up, codes - 1, codes).view(FP8_DTYPES[kind])


def dequantize(q: torch.Tensor, decode_scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values float(q) * d of an FP8 tensor, computed in float32, returned in `dtype`."""
    return (q.to(torch.float32) * decode_scale.to(device=q.device, dtype=torch.float32)).to(dtype)
