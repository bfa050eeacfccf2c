"""vLLM 0.32's per-token-head KV caches: `int8_per_token_head`, `fp8_per_token_head`, `int4_per_token_head`.

Emulated as vLLM's Triton store kernels write them (v1/attention/ops/triton_reshape_and_cache_flash.py
`_reshape_cache_per_token_head`; v1/attention/ops/int4_per_token_head.py `_reshape_cache_int4_kernel`) and
its attention reads them back, one (token, head) row of D elements at a time, in float32:

- int8 / fp8: s = max(amax_row / QMAX, 1e-6) (QMAX 127 or 448), q = x * (1 / s); int8 rounds half away
  from zero (q +- 0.5, clamped to [-128, 127], truncated by the int8 store); fp8 clamps to +-448 and the
  store rounds to nearest even (E4M3, NVIDIA's e4nv). Stored: the codes and s as float32. Read back:
  attention scales Q K^T and P by s per token, which is the value code * s.
- int4: x is first rotated by vLLM's randomized Hadamard transform (RHT: sign flips from a fixed seed,
  then an unnormalized Walsh-Hadamard butterfly over the largest power-of-two block b of D, in float32,
  cast back to x's dtype), then quantized asymmetrically per row: s = max((max - min) / 15, 1e-6),
  zp = clamp(round_half_away(-min / s), 0, 15), code = clamp(round_half_away(x / ... ), 0, 15) with the
  kernel's x * (1 / s) + zp; two codes per byte (element 2i in the low nibble) and the zero point hidden
  in the 4 low mantissa bits of the float32 scale. Read back: (code - zp) * s with those 4 bits cleared,
  rotated back by the inverse RHT and divided by b, as `unified_attention_int4` does to its output.

Where a GPU could differ from these (and from the Triton interpreter the fixtures come from): Triton's
float32 division `/` may lower to an approximate division on NVIDIA (s, 1 / s, -min / s); `x * inv + zp`
and `q + 0.5` may be contracted into one fused multiply-add; on CUDA sm80+ the RHT runs in Hadacore on a
bfloat16 copy of x (x @ H/sqrt(b), then * sqrt(b)) instead of the float32 butterfly (vLLM's CPU path and
the one emulated here); ROCm's fnuz FP8 uses QMAX 224, not 448.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from quant.errors import QuantError
from quant.formats.fp8 import check_finite
from quant.formats.minifloat import pack_nibbles, unpack_nibbles
from quant.formats.quantized import QuantizedTensor

PerTokenHeadKind = Literal["int8", "fp8"]
INT8_QMAX, INT8_QMIN = 127.0, -128.0  # vLLM's _PER_TOKEN_HEAD_QUANT_PARAMS[torch.int8]
FP8_QMAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max: CUDA's FP8 KV dtype (ROCm fnuz: 224)
MIN_SCALE = 1e-6  # the kernels' floor on a row's scale (an all-zero row stores 1e-6)
INT4_LEVELS = 15.0  # 4-bit codes 0..15
ZP_BITS_MASK = 0xF  # the zero point lives in the scale's 4 low mantissa bits
RHT_SEED = 0x9E3779B9  # vLLM's _get_rht_signs(d, round_idx=0): seed 0x9E3779B9 + 0 * 0x517CC1B7


def _rows(x: torch.Tensor, what: str) -> torch.Tensor:
    """x [..., D] as float32, after the checks every format here shares."""
    check_finite(x, what)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise QuantError(f"{what} needs a tensor [..., D], got shape {tuple(x.shape)}")
    return x.to(torch.float32)


def _round_half_away(q: torch.Tensor) -> torch.Tensor:
    """The kernels' where(q >= 0, q + 0.5, q - 0.5) before a truncating float -> int conversion (float32)."""
    return torch.where(q >= 0, q + 0.5, q - 0.5).to(torch.int32).to(torch.float32)


def quantize_rows(x: torch.Tensor, kind: PerTokenHeadKind) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of x [..., D]: int8 codes or float8_e4m3fn codes [..., D] and float32 scales [..., 1]."""
    xf = _rows(x, f"{kind}_per_token_head")
    qmax = INT8_QMAX if kind == "int8" else FP8_QMAX
    scales = torch.clamp_min(xf.abs().amax(dim=-1, keepdim=True) / qmax, MIN_SCALE)  # [..., 1]
    q = xf * (1.0 / scales)
    if kind == "int8":
        q = torch.where(q >= 0, q + 0.5, q - 0.5).clamp(INT8_QMIN, INT8_QMAX)
        return q.to(torch.int8), scales  # the int8 store truncates toward zero
    return q.clamp(-FP8_QMAX, FP8_QMAX).to(torch.float8_e4m3fn), scales  # store: round to nearest even


def dequantize_rows(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Values code * scale [..., D] in float32 (what attention's per-token scaling of Q K^T and P applies)."""
    return codes.to(torch.float32) * scales


def largest_pow2_divisor(n: int) -> int:
    """vLLM's largest_power_of_2_divisor: the lowest set bit of n (64 for 64, 32 for 96)."""
    return n & -n


def rht_signs(d: int) -> torch.Tensor:
    """vLLM's +-1 float32 sign vector of length d for the RHT (a torch CPU generator at RHT_SEED)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(RHT_SEED)
    return 2.0 * torch.bernoulli(torch.full((d,), 0.5), generator=gen) - 1.0


def hadamard_butterfly(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized Walsh-Hadamard transform over the last dimension (a power of two), vLLM's CPU tier."""
    d = x.shape[-1]
    h = 1
    while h < d:
        xv = x.view(*x.shape[:-1], d // (2 * h), 2, h)  # [..., d/2h, 2, h]
        a, b = xv[..., 0, :], xv[..., 1, :]
        x = torch.stack([a + b, a - b], dim=-2).reshape(x.shape)
        h <<= 1
    return x


def single_rht(x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """vLLM's single_rht: H (signs * x) forward, (H x) * signs inverse, block-diagonal over blocks of
    largest_pow2_divisor(D); x float32 [..., D]."""
    d = x.shape[-1]
    block = largest_pow2_divisor(d)
    if block < d:
        lead = x.shape[:-1]
        return single_rht(x.reshape(*lead, d // block, block), inverse).reshape(*lead, d)  # [..., D/b, b]
    signs = rht_signs(d).to(x.device)
    return hadamard_butterfly(x) * signs if inverse else hadamard_butterfly(x * signs)


@dataclass(frozen=True)
class Int4Rows:
    """int4_per_token_head rows as vLLM stores them."""

    packed: torch.Tensor  # uint8 [..., D/2]: element 2i in the low nibble
    scales: torch.Tensor  # float32 [..., 1]: scale with the zero point in its 4 low mantissa bits


def quantize_int4(x: torch.Tensor) -> Int4Rows:
    """int4_per_token_head of x [..., D] (D even): RHT in float32, cast to x's dtype, then the store kernel."""
    _rows(x, "int4_per_token_head")
    if x.shape[-1] % 2:
        raise QuantError(f"int4_per_token_head needs an even head_dim, got {x.shape[-1]}")
    rotated = single_rht(x.to(torch.float32)).to(x.dtype).to(torch.float32)  # reshape_and_cache_int4
    lo = rotated.amin(dim=-1, keepdim=True)  # [..., 1]
    hi = rotated.amax(dim=-1, keepdim=True)
    scale = torch.clamp_min((hi - lo) / INT4_LEVELS, MIN_SCALE)
    zp = _round_half_away(-lo / scale).clamp(0.0, INT4_LEVELS)
    codes = _round_half_away(rotated * (1.0 / scale) + zp).clamp(0.0, INT4_LEVELS)
    bits = (scale.view(torch.int32) & -16) | (zp.to(torch.int32) & ZP_BITS_MASK)
    return Int4Rows(packed=pack_nibbles(codes.to(torch.uint8)), scales=bits.view(torch.float32))


def dequantize_int4(q: Int4Rows) -> torch.Tensor:
    """Values [..., D] in float32: ((code - zp) * scale), inverse RHT, / b (unified_attention_int4's order)."""
    bits = q.scales.view(torch.int32)
    zp = (bits & ZP_BITS_MASK).to(torch.float32)
    scale = (bits & -16).view(torch.float32)
    rotated = (unpack_nibbles(q.packed).to(torch.float32) - zp) * scale
    return single_rht(rotated, inverse=True) / largest_pow2_divisor(rotated.shape[-1])


def unpack_int4_scale(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale with the zero-point bits cleared, zero point) from int4_per_token_head's float32 scales."""
    bits = scales.view(torch.int32)
    return (bits & -16).view(torch.float32), bits & ZP_BITS_MASK


def _check_name(name: str, q: QuantizedTensor) -> None:
    if q.format != name:
        raise QuantError(f"cannot dequantize a {q.format!r} tensor with format {name!r}")


@dataclass(frozen=True)
class PerTokenHeadFormat:
    """`int8_per_token_head` / `fp8_per_token_head`: vLLM's dynamic per-(token, head) int8 / FP8 E4M3 cache."""

    name: str
    kind: PerTokenHeadKind
    bits_per_element: float = 8.0 + 32 / 128  # one float32 scale per row of head_dim 128
    needs_tensor_scale: bool = False

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """vLLM's store of x [..., D] (scale ignored: one scale per row, computed here)."""
        codes, scales = quantize_rows(x, self.kind)
        return QuantizedTensor(self.name, tuple(x.shape), {"codes": codes, "scales": scales}, None)

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """code * row scale, in float32, returned in `dtype`."""
        _check_name(self.name, q)
        return dequantize_rows(q.data["codes"], q.data["scales"]).to(dtype)

    def decode_scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """max(amax / QMAX, 1e-6): the row scale the kernel computes itself."""
        qmax = INT8_QMAX if self.kind == "int8" else FP8_QMAX
        return torch.clamp_min(amax.to(torch.float32) / qmax, MIN_SCALE)


@dataclass(frozen=True)
class Int4PerTokenHeadFormat:
    """`int4_per_token_head`: vLLM's RHT-rotated asymmetric 4-bit cache, zero point inside the scale."""

    name: str = "int4_per_token_head"
    bits_per_element: float = 4.0 + 32 / 128  # one float32 scale (zero point inside) per row of 128
    needs_tensor_scale: bool = False

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """vLLM's RHT + store of x [..., D] (scale ignored: one scale and zero point per row)."""
        t = quantize_int4(x)
        return QuantizedTensor(self.name, tuple(x.shape), {"packed": t.packed, "scales": t.scales}, None)

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values attention reads, rotated back to x's basis (`dequantize_int4`), in `dtype`."""
        _check_name(self.name, q)
        return dequantize_int4(Int4Rows(packed=q.data["packed"], scales=q.data["scales"])).to(dtype)

    def decode_scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """2 amax / 15: the row scale of a row spanning [-amax, amax] (the kernel computes its own)."""
        return torch.clamp_min(2.0 * amax.to(torch.float32) / INT4_LEVELS, MIN_SCALE)
