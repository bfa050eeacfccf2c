"""The FP8 KV-cache write compiled with torch.compile: `fp8.quantize` and `fp8.dequantize` of the same
tensor from one loop, with the same bytes and values (tests/quant/formats/test_fp8_fused.py).

The emulated cache's recent window stores FP8; eager, its quantize + dequantize makes five passes
over the tensor (finite check, divide, clamp, cast, and back), the compiled one a single pass.
"""

from __future__ import annotations

import torch

from quant.errors import QuantError
from quant.formats import compiled, fp8


def _roundtrip_impl(
    x: torch.Tensor, d: torch.Tensor, fp8_dtype: torch.dtype, fp8_max: float, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [R, K], decode scale d float32 [R, 1] -> fp8 codes [R, K], values float(q) * d in out_dtype,
    all-finite flag of x."""
    q = (x.to(torch.float32) / d).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    values = (q.to(torch.float32) * d).to(out_dtype)
    return q, values, torch.isfinite(x).all()


def checked_scale(decode_scale: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The decode scale as float32 on `device`; QuantError unless every value is positive and finite."""
    d = decode_scale.to(device=device, dtype=torch.float32)
    if not bool(((d > 0) & torch.isfinite(d)).all()):
        raise QuantError(f"FP8 decode scale must be positive and finite, got {d.flatten()[:4].tolist()}")
    return d


def roundtrip(
    x: torch.Tensor, decode_scale: torch.Tensor, kind: fp8.FP8Kind, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(fp8.quantize(x, d, kind), fp8.dequantize(that, d, dtype)) from one compiled loop; `dtype`
    defaults to x's. None when the compiled path failed (the caller quantizes eagerly). QuantError
    on NaN/Inf input or a scale that is not positive and finite, as the eager path."""
    d = checked_scale(decode_scale, x.device)
    lead, k = tuple(x.shape[:-1]), x.shape[-1]
    out = compiled.call(_roundtrip_impl, "FP8", compiled.rows(x.reshape(-1, k)),
                        compiled.rows(compiled.per_row(d, lead, x.device)), fp8.FP8_DTYPES[kind],
                        fp8.FP8_MAX[kind], dtype or x.dtype)
    if out is None:
        return None
    q, values, finite = out
    if not bool(finite):
        raise QuantError(f"FP8 {kind} input holds NaN or Inf: a KV cache with non-finite values is a model bug")
    return q.reshape(x.shape), values.reshape(x.shape)

