"""Fused NVFP4 fast path: the kernel recipe of `quant.formats.nvfp4` compiled with torch.compile (C++ on CPU).

Same arithmetic as `nvfp4.quantize(x, global_scale=gs)` / `nvfp4.dequantize`, written so inductor can
fuse each direction into one loop, and bit-identical to them (tests/quant/formats/test_nvfp4_fused.py checks
the oracle vectors and random tensors). Constants are fp32 values: inductor's C++ code multiplies by
double literals, and a double product of two fp32 numbers rounded to fp32 is the fp32 product only
when the literal is itself an fp32 value. The first call per dtype compiles (tens of seconds on a
small CPU; cached on disk by inductor), so this path is opt-in: `get_format(name, fused=True)`.

`encode_blocks` / `block_values` are the recipe on any leading shape, for `quant.formats.capture` (the
values-only K/V rewrite of the vLLM plugin).

`roundtrip` is the one the emulated KV cache uses on CPU: the stored bytes and the dequantized values of
x from one compiled loop (codes never read back), 4-7x faster than eager `quantize` + `dequantize` on
KV-cache writes (`benchmarks/quant_speed.py`). `quant.formats.compiled.enabled` decides whether it runs (CPU
tensors, unless `QA_KV_COMPILED=0`); after a compile or runtime failure it returns None and callers
take the eager path.
"""

from __future__ import annotations

import torch

from quant.errors import QuantError
from quant.formats import compiled, nvfp4
from quant.formats.minifloat import F8_E4M3_MAX, pack_nibbles

INV_6_F32 = float(torch.tensor(1.0 / 6.0, dtype=torch.float32))  # fl32(1/6), as the kernel's 1.0f / 6.0f
# E2M1 decision points (ties to even): above a "strict" point rounds up, at it stays down
_STRICT = (0.25, 1.25, 2.5, 5.0)  # ties go to the lower (even) code
_INCLUSIVE = (0.75, 1.75, 3.5)  # ties go to the upper (even) code


def e2m1_magnitude(a: torch.Tensor) -> torch.Tensor:
    """E2M1 magnitude codes (int32, 0..7) of |y| = a: the number of decision points passed."""
    # int32 accumulation vectorizes in inductor's C++ (uint8 mask arithmetic does not)
    mag = (a > _STRICT[0]).to(torch.int32)
    for t in _STRICT[1:]:
        mag = mag + (a > t).to(torch.int32)
    for t in _INCLUSIVE:
        mag = mag + (a >= t).to(torch.int32)
    return mag


def _e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (int32) of float32 y: count the decision points passed, sign bit from y < 0."""
    return e2m1_magnitude(y.abs()) + (y < 0).to(torch.int32) * 8


def _quantize_impl(x: torch.Tensor, gs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [R, K] float, gs float32 [R, 1] -> packed uint8 [R, K/2], scale bytes [R, K/16], all-finite flag."""
    rows = x.shape[0]
    blocks = x.reshape(rows, -1, nvfp4.BLOCK_SIZE).to(torch.float32)  # [R, K/16, 16]
    amax = blocks.abs().amax(dim=-1)  # [R, K/16]
    sf = gs * (amax * INV_6_F32)
    s = sf.clamp(max=F8_E4M3_MAX).to(torch.float8_e4m3fn)
    s32 = s.to(torch.float32)
    out = torch.where(s32 != 0, 1.0 / (s32 * (1.0 / gs)), 0.0).unsqueeze(-1)  # [R, K/16, 1]
    # one output byte per (even, odd) pair, so the codes never hit memory
    pairs = x.reshape(rows, -1, nvfp4.BLOCK_SIZE // 2, 2).to(torch.float32)  # [R, K/16, 8, 2]
    low, high = _e2m1_codes(pairs[..., 0] * out), _e2m1_codes(pairs[..., 1] * out)  # [R, K/16, 8]
    packed = (low + high * 16).to(torch.uint8).reshape(rows, -1)  # [R, K/2]
    return packed, s.view(torch.uint8), torch.isfinite(amax).all()


def encode_blocks(x: torch.Tensor, gs: torch.Tensor,
                  inv_block_max: float = INV_6_F32) -> tuple[torch.Tensor, ...]:
    """The kernel recipe on x [..., K] float with gs float32 broadcastable to [..., 1] (`inv_block_max` 0.25:
    4over6's amax-to-4 choice): block scales s (E4M3), s as float32, 1/gs, E2M1 magnitude codes (int32
    [..., K/16, 16]), the sign mask, and the block amax."""
    blocks = x.unflatten(-1, (-1, nvfp4.BLOCK_SIZE)).to(torch.float32)  # [..., K/16, 16]
    amax = blocks.abs().amax(dim=-1)  # [..., K/16]
    s = (gs * (amax * inv_block_max)).clamp(max=F8_E4M3_MAX).to(torch.float8_e4m3fn)
    s32 = s.to(torch.float32)
    inv_gs = 1.0 / gs  # [..., 1]
    out = torch.where(s32 != 0, 1.0 / (s32 * inv_gs), 0.0).unsqueeze(-1)  # [..., K/16, 1]
    y = blocks * out
    return s, s32, inv_gs, e2m1_magnitude(y.abs()), y < 0, amax


def block_values(mag: torch.Tensor, negative: torch.Tensor, s32: torch.Tensor, inv_gs: torch.Tensor) -> torch.Tensor:
    """Dequantized float32 values [..., K/16, 16]: (code * s) * (1/gs); the E2M1 magnitude of code m as in
    _dequantize_impl; code 8 (a negative that rounds to 0) is -0.0."""
    m = mag.to(torch.float32)
    value = torch.where(m < 4, m * 0.5, torch.where(m < 6, m - 2.0, m * 2.0 - 8.0))
    value = torch.where(negative, -value, value)
    return (value * s32.unsqueeze(-1)) * inv_gs.unsqueeze(-1)


def decode_blocks(mag: torch.Tensor, negative: torch.Tensor, s32: torch.Tensor, inv_gs: torch.Tensor,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """`block_values` flattened to [..., K] and cast to out_dtype."""
    return block_values(mag, negative, s32, inv_gs).flatten(-2).to(out_dtype)


def _roundtrip_impl(
    x: torch.Tensor, gs: torch.Tensor, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [R, K] float, gs float32 [R, 1] -> codes uint8 [R, K], scale bytes [R, K/16], dequantized
    values [R, K] in out_dtype, all-finite flag."""
    s, s32, inv_gs, mag, negative, amax = encode_blocks(x, gs)
    codes = (mag + negative.to(torch.int32) * 8).to(torch.uint8).reshape(x.shape[0], -1)
    values = decode_blocks(mag, negative, s32, inv_gs, out_dtype)
    return codes, s.view(torch.uint8), values, torch.isfinite(amax).all()


def _dequantize_impl(packed: torch.Tensor, scales: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    """packed uint8 [R, K/2], scale bytes [R, K/16], gs float32 [R, 1] -> float32 [R, K]."""
    nibbles = torch.stack((packed & 0x0F, packed >> 4), dim=-1)  # [R, K/2, 2]: low nibble first
    codes = nibbles.reshape(packed.shape[0], -1, nvfp4.BLOCK_SIZE).to(torch.float32)  # [R, K/16, 16]
    negative = codes >= 8
    m = torch.where(negative, codes - 8.0, codes)
    # E2M1 magnitude of index m, piecewise linear and exact: 0.5m below 4 (0..1.5), m - 2 for 4, 5
    # (2, 3), 2m - 8 for 6, 7 (4, 6)
    value = torch.where(m < 4, m * 0.5, torch.where(m < 6, m - 2.0, m * 2.0 - 8.0))
    value = torch.where(negative, -value, value)
    s = scales.view(torch.float8_e4m3fn).to(torch.float32).unsqueeze(-1)  # [R, K/16, 1]
    return ((value * s) * (1.0 / gs).unsqueeze(-1)).reshape(packed.shape[0], -1)


def quantize(
    x: torch.Tensor,
    *,
    decode_scale: torch.Tensor | float | None = None,
    global_scale: torch.Tensor | float | None = None,
) -> nvfp4.NVFP4Tensor:
    """Fused `nvfp4.quantize(..., recipe="kernel")`: same arguments, same bytes."""
    nvfp4.check_input(x)
    gs = nvfp4.resolve_global_scale(x, decode_scale, global_scale)
    lead, k = tuple(x.shape[:-1]), x.shape[-1]
    x2d = compiled.rows(x.reshape(-1, k))  # [R, K]
    packed, scales, finite = compiled.compiled(_quantize_impl)(x2d, compiled.rows(compiled.per_row(gs, lead, x.device)))
    if not bool(finite):
        raise QuantError(nvfp4.NON_FINITE_MESSAGE)
    return nvfp4.NVFP4Tensor(
        packed=packed.reshape(*lead, k // 2), scales=scales.reshape(*lead, k // nvfp4.BLOCK_SIZE), global_scale=gs
    )


def dequantize(q: nvfp4.NVFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Fused `nvfp4.dequantize` of a kernel-recipe tensor: same float32 values, then cast to `dtype`."""
    lead, half = tuple(q.packed.shape[:-1]), q.packed.shape[-1]
    gs = compiled.per_row(q.global_scale, lead, q.packed.device)
    packed = compiled.rows(q.packed.reshape(-1, half))  # [R, K/2]
    scales = compiled.rows(q.scales.reshape(-1, half // 8))  # [R, K/16]
    values = compiled.compiled(_dequantize_impl)(packed, scales, compiled.rows(gs))
    return values.reshape(*lead, half * 2).to(dtype)


def roundtrip(
    x: torch.Tensor, decode_scale: torch.Tensor | float, dtype: torch.dtype | None = None
) -> tuple[nvfp4.NVFP4Tensor, torch.Tensor] | None:
    """`nvfp4.quantize(x, decode_scale=d)` and `nvfp4.dequantize(that, dtype)` from one compiled loop:
    the same bytes and the same values. `dtype` defaults to x's. None when the compiled path failed
    (logged once; the caller quantizes eagerly). QuantError on NaN/Inf input or a bad scale."""
    nvfp4.check_input(x)
    gs = nvfp4.global_scale_from_decode_scale(decode_scale).to(x.device)
    lead, k = tuple(x.shape[:-1]), x.shape[-1]
    out = compiled.call(_roundtrip_impl, "NVFP4", compiled.rows(x.reshape(-1, k)),
                        compiled.rows(compiled.per_row(gs, lead, x.device)), dtype or x.dtype)
    if out is None:
        return None
    codes, scales, values, finite = out
    if not bool(finite):
        raise QuantError(nvfp4.NON_FINITE_MESSAGE)
    t = nvfp4.NVFP4Tensor(
        packed=pack_nibbles(codes.reshape(*lead, k)), scales=scales.reshape(*lead, k // nvfp4.BLOCK_SIZE),
        global_scale=gs,
    )
    return t, values.reshape(x.shape)

