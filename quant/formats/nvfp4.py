"""NVFP4: FP4 E2M1 elements in blocks of 16, one FP8 E4M3 scale per block, one FP32 scale per tensor.

Bit-exact with the kernel operation order of TensorRT-LLM / vLLM (`cvt_warp_fp16_to_fp4`) and
FlashInfer's reference quantizer (docs/NVFP4.md):

    SF   = gs * (amax_block * (1/6))         # fp32, 1/6 rounded to fp32 first
    s    = e4m3(SF)                          # RNE, saturating at 448; SF <= 2**-10 underflows to 0
    out  = 1 / (s * (1/gs))  if s != 0 else 0
    code = e2m1(x * out)                     # RNE, saturating at 6; sign bit = (x * out < 0)
    x^   = e2m1_value(code) * s * (1/gs)     # dequantization, left to right in fp32

`gs` is the FP32 *encode* scale (vLLM kernels, FlashInfer, compressed-tensors); a checkpoint's
`k_scale`/`v_scale` is the *decode* scale d and gives gs = fl32(1/d). Dynamic quantization takes
gs = fl32(2688 * fl32(1/amax(|x|))): torch evaluates `2688.0 / tensor` as reciprocal-then-multiply,
and compressed-tensors and FlashInfer's reference inherit that (amax = 7 gives 384.00003, not 384).

`quantize_4over6` is the same layout with a per-block choice of amax/6 or amax/4 scaling. This module
is the pure, vectorized reference (CPU or GPU); `quant.formats.nvfp4_fused` is its torch.compile'd twin.

Agreement with the reference libraries on the shared vectors (vectors.npz; every case except the
informational `special_inf_nan_2x32`, on which this module raises instead):
- `fi` (FlashInfer's reference formula): recipe "kernel" gives identical packed bytes, scale bytes and
  dequantized float32 on every case.
- `ct` (compressed-tensors 0.20.1): recipe "compressed_tensors" gives identical packed bytes, scale
  bytes and dequantized float32 on every case. It differs from "kernel" in three ways: SF uses
  `amax / 6` (not `amax * fl32(1/6)`); a zero block scale is replaced by E4M3 eps 2**-3 (byte 0x20),
  so tiny negative inputs of an underflowed block keep code 8 (-0) where the kernel writes 0; and it
  divides by the fp32 effective scale `s / gs` and dequantizes as `code * (s / gs)`. So "kernel" and
  ct codes differ only at exact E2M1 ties (one element of `static_calib_3x8x128`) and in the sign of
  zero codes of underflowed blocks (`edge_4x64`, `static_d*`), and their dequantized values differ in
  the last bit wherever `(code * s) * (1/gs)` and `code * (s / gs)` round differently.
- `ao` (torchao 0.18.0) and `mo` (ModelOpt 0.47.0) keep the decode scale d = amax/2688 instead of gs
  and divide by the fp32 product of the block scale and d. With a dynamic scale gs * d != 1 in fp32,
  so their dequantized values differ from the kernel's in the last bits almost everywhere (`rand_4x64`,
  `kv_3x8x128`, `adv_disagree`, `gs384_2x64`), and on exact E2M1 ties the last bit of the stored FP32
  scale decides the code: `adv_disagree` (63 codes), `gs384_2x64` (24 codes: gs = 2688 * fl32(1/7) =
  384.00003 while d = 7/2688 is exact), `kv_3x8x128` (ao 2, mo 1), `static_calib_3x8x128` (mo 1).
  Zero and tiny blocks: ao clamps the block scale up to the smallest E4M3 subnormal instead of
  flushing it to zero (and ModelOpt stores byte 0x38 = 1.0 for all-zero blocks), so scale bytes differ
  on `edge_4x64`, `static_d1_2x4x64`, `static_d0p25_2x4x64` and the kernel's all-zero underflowed
  blocks come back as small nonzero codes there. ao also rounds amax / 6 rather than amax * fl32(1/6),
  which moves E4M3 scale ties in `edge_4x64` (one scale byte, 13 codes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from quant.errors import QuantError
from quant.formats.minifloat import (
    F4_E2M1_MAX,
    F8_E4M3_MAX,
    e2m1_decode,
    e2m1_decode_packed,
    e2m1_encode_,
    e4m3_from_bytes,
    e4m3_round,
    e4m3_to_bytes,
    pack_nibbles,
)

BLOCK_SIZE = 16  # elements per E4M3 block scale (NVIDIA Blackwell NVFP4)
NVFP4_AMAX = F8_E4M3_MAX * F4_E2M1_MAX  # 2688.0: largest representable |x| * gs
INV_6 = 1.0 / F4_E2M1_MAX  # rounded to fp32 before use, as the kernel's `1.0f / 6.0f` literal
# Dynamic gs is capped so that 1 / (s * (1/gs)) stays finite for every E4M3 scale s >= 2**-9:
# 2**64 keeps (1/gs) * 2**-9 a normal fp32 number. Only a tensor with amax < 2688 * 2**-64 hits it.
MAX_GLOBAL_SCALE = 2.0**64
# ...and at least 2**-114, so that the largest dequantized value 2688 / gs = 2688 * 2**114 ~ 5.6e37
# stays finite (an amax above that saturates); float32 max is ~3.4e38 = 2**128.
MIN_GLOBAL_SCALE = 2.0**-114

NON_FINITE_MESSAGE = (
    "input holds NaN or Inf: a KV cache with non-finite values is a model bug; fix the model or inputs "
    "before quantizing"
)

Recipe = Literal["kernel", "compressed_tensors"]
RECIPES: tuple[str, ...] = ("kernel", "compressed_tensors")
# compressed-tensors replaces a zero block scale by torch.finfo(float8_e4m3fn).eps = 2**-3 (byte 0x20)
CT_ZERO_SCALE_EPS = 0.125


@dataclass(frozen=True)
class NVFP4Tensor:
    """An NVFP4-quantized tensor in the kernel's storage layout."""

    packed: torch.Tensor  # uint8 [..., K/2]: element 2i in the low nibble, 2i+1 in the high nibble
    scales: torch.Tensor  # uint8 [..., K/16]: raw E4M3 block-scale bytes
    global_scale: torch.Tensor  # float32 encode scale gs: shape () or broadcastable to [..., 1]
    recipe: Recipe = "kernel"  # operation order used to quantize, and to be used to dequantize

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the original (dequantized) tensor [..., K]."""
        return (*self.packed.shape[:-1], self.packed.shape[-1] * 2)


def check_input(x: torch.Tensor) -> None:
    """Raise QuantError unless x is floating point with a last dimension that is a multiple of 16."""
    if not x.is_floating_point():
        raise QuantError(f"NVFP4 quantizes floating-point tensors, got dtype {x.dtype}")
    if x.dim() == 0 or x.shape[-1] % BLOCK_SIZE:
        raise QuantError(
            f"NVFP4 needs a last dimension that is a multiple of {BLOCK_SIZE}, got shape {tuple(x.shape)}"
        )


def check_finite_amax(block_amax: torch.Tensor) -> None:
    """Raise QuantError if any block maximum is NaN or Inf."""
    # amax propagates NaN and Inf, so checking the 16x smaller block maxima covers every element
    if not bool(torch.isfinite(block_amax).all()):
        raise QuantError(NON_FINITE_MESSAGE)


def global_scale_from_decode_scale(decode_scale: torch.Tensor | float) -> torch.Tensor:
    """Encode scale gs = fl32(1 / d) from a checkpoint-style decode scale d (k_scale / v_scale)."""
    d = torch.as_tensor(decode_scale, dtype=torch.float32)
    gs = torch.reciprocal(d)
    # one check covers d <= 0, NaN and Inf (their reciprocals all fall outside the range)
    if not bool(((gs >= MIN_GLOBAL_SCALE) & (gs <= MAX_GLOBAL_SCALE)).all()):
        raise QuantError(
            f"NVFP4 decode scale must be positive and finite, with 1/d in [2**-114, 2**64]; "
            f"got {d.flatten()[:4].tolist()}"
        )
    return gs


def _validated_gs(gs: torch.Tensor) -> torch.Tensor:
    if not bool(((gs >= MIN_GLOBAL_SCALE) & (gs <= MAX_GLOBAL_SCALE)).all()):
        raise QuantError(
            f"NVFP4 global (encode) scale must lie in [2**-114, 2**64], got {gs.flatten()[:4].tolist()}; "
            "a decode scale d gives gs = 1/d"
        )
    return gs


def dynamic_global_scale(x: torch.Tensor) -> torch.Tensor:
    """Encode scale gs = fl32(2688 * fl32(1/amax(|x|))) over the whole tensor; 1.0 for an all-zero tensor."""
    amax = x.abs().amax().to(torch.float32)
    gs = (torch.reciprocal(amax) * NVFP4_AMAX).clamp(min=MIN_GLOBAL_SCALE, max=MAX_GLOBAL_SCALE)
    # all zeros: any gs gives all-zero codes; 1.0 is compressed-tensors' fallback
    return torch.where(amax == 0, torch.ones_like(gs), gs)


def resolve_global_scale(
    x: torch.Tensor, decode_scale: torch.Tensor | float | None, global_scale: torch.Tensor | float | None
) -> torch.Tensor:
    """Encode scale gs from exactly one of decode_scale / global_scale, or dynamically from x."""
    if decode_scale is not None and global_scale is not None:
        raise QuantError("give NVFP4 either decode_scale (d) or global_scale (gs = 1/d), not both")
    if decode_scale is not None:
        gs = global_scale_from_decode_scale(decode_scale)
    elif global_scale is not None:
        gs = _validated_gs(torch.as_tensor(global_scale, dtype=torch.float32))
    else:
        return dynamic_global_scale(x)
    return gs.to(x.device)


def _compute_dtype(x: torch.Tensor) -> torch.Tensor:
    """x itself if fp32/bf16/fp16 (the kernel's inputs; all exact in fp32), else x rounded to fp32."""
    return x if x.dtype in (torch.float32, torch.bfloat16, torch.float16) else x.to(torch.float32)


def _blocks_and_amax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # x stays in its 16-bit dtype if it has one: |x| and max are exact there, and `blocks * out`
    # promotes to float32 exactly as converting first would
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)  # [..., K/16, 16]
    block_amax = blocks.abs().amax(dim=-1).to(torch.float32)  # [..., K/16]
    check_finite_amax(block_amax)
    return blocks, block_amax


def _kernel_blocks(
    blocks: torch.Tensor, block_amax: torch.Tensor, gs: torch.Tensor, inv_block_max: float
) -> tuple[torch.Tensor, torch.Tensor]:
    # gs may be per head [..., 1]: it broadcasts against block_amax [..., K/16]
    s = e4m3_round(gs * (block_amax * inv_block_max))  # [..., K/16]
    # an underflowed block (s == 0) multiplies by 0: all codes 0 (the sign test is y < 0)
    out = torch.reciprocal(s * torch.reciprocal(gs)).masked_fill_(s == 0, 0.0)  # [..., K/16]
    return e2m1_encode_(blocks * out.unsqueeze(-1)), s


def quantize_blocks(
    x: torch.Tensor, gs: torch.Tensor, recipe: Recipe = "kernel"
) -> tuple[torch.Tensor, torch.Tensor]:
    """E2M1 codes [..., K/16, 16] and E4M3 block scales (float32) [..., K/16] of x for encode scale gs.

    `gs` is float32 of shape () or broadcastable to x[..., :1]; x is float32 with K % 16 == 0.
    """
    blocks, block_amax = _blocks_and_amax(x)
    if recipe == "kernel":
        return _kernel_blocks(blocks, block_amax, gs, INV_6)
    # compressed_tensors: SF = gs * (amax / 6); a zero scale becomes eps; divide by s / gs
    s = e4m3_round(gs * (block_amax / F4_E2M1_MAX))
    s = torch.where(s == 0, CT_ZERO_SCALE_EPS, s)
    return e2m1_encode_(blocks / (s / gs).unsqueeze(-1)), s


def quantize(
    x: torch.Tensor,
    *,
    decode_scale: torch.Tensor | float | None = None,
    global_scale: torch.Tensor | float | None = None,
    recipe: Recipe = "kernel",
) -> NVFP4Tensor:
    """Quantize x [..., K] (K % 16 == 0) to NVFP4 with decode scale d, encode scale gs, or dynamically.

    `decode_scale` d (checkpoint k_scale convention) gives gs = fl32(1/d); `global_scale` is gs itself;
    both may be a float32 scalar or a tensor broadcastable to x[..., :1] (e.g. one per head). With
    neither, gs = fl32(2688 * fl32(1/amax(|x|))). Raises QuantError on NaN/Inf input.
    """
    if recipe not in RECIPES:
        raise QuantError(f"unknown NVFP4 recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    check_input(x)
    xf = _compute_dtype(x)
    gs = resolve_global_scale(xf, decode_scale, global_scale)
    codes, s = quantize_blocks(xf, gs, recipe)
    packed = pack_nibbles(codes.reshape(x.shape))  # [..., K/2]
    return NVFP4Tensor(packed=packed, scales=e4m3_to_bytes(s), global_scale=gs, recipe=recipe)


def _scale_values_(values: torch.Tensor, scales: torch.Tensor, gs: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Scale E2M1 values [..., K/16, 16] in place by E4M3 scales [..., K/16] and encode scale gs."""
    gs = gs.unsqueeze(-1) if gs.dim() else gs  # per-head gs [..., 1] -> [..., 1, 1]
    if recipe == "kernel":
        return values.mul_(scales.unsqueeze(-1)).mul_(torch.reciprocal(gs))  # (code * s) * (1/gs)
    return values.mul_(scales.unsqueeze(-1) / gs)  # compressed-tensors: code * (s / gs)


def dequantize_blocks(
    codes: torch.Tensor, scales: torch.Tensor, gs: torch.Tensor, recipe: Recipe = "kernel"
) -> torch.Tensor:
    """Float32 values [..., K/16, 16] of codes [..., K/16, 16] with E4M3 scales (float32) [..., K/16]."""
    return _scale_values_(e2m1_decode(codes), scales, gs, recipe)


def dequantize(q: NVFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of q [..., K] in `dtype`, computed in fp32 in q.recipe's order (kernel: (code * s) * (1/gs))."""
    values = e2m1_decode_packed(q.packed)  # [..., K]
    values = values.reshape(*values.shape[:-1], values.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)  # [..., K/16, 16]
    values = _scale_values_(values, e4m3_from_bytes(q.scales), q.global_scale, q.recipe)
    return values.reshape(q.shape).to(dtype)

def quantize_4over6(
    x: torch.Tensor,
    *,
    decode_scale: torch.Tensor | float | None = None,
    global_scale: torch.Tensor | float | None = None,
    block_max: Literal["adaptive", 4, 6] = "adaptive",
) -> NVFP4Tensor:
    """NVFP4 where each block scales its amax to 6 or to 4, whichever reconstructs it with less squared error.

    Same layout, global scale conventions and dequantization as `quantize` (kernel recipe); a block's
    squared error is summed in float64 and a tie keeps the standard amax/6 scale. `block_max` 4 or 6
    forces one choice for every block (for comparisons).
    """
    check_input(x)
    xf = _compute_dtype(x)
    gs = resolve_global_scale(xf, decode_scale, global_scale)
    blocks, block_amax = _blocks_and_amax(xf)
    if block_max in (4, 6):
        codes, s = _kernel_blocks(blocks, block_amax, gs, 1.0 / block_max)
    else:
        codes6, s6 = _kernel_blocks(blocks, block_amax, gs, INV_6)
        codes4, s4 = _kernel_blocks(blocks, block_amax, gs, 0.25)
        ref = blocks.to(torch.float64)
        err6 = (dequantize_blocks(codes6, s6, gs).to(torch.float64) - ref).square().sum(-1)  # [..., K/16]
        err4 = (dequantize_blocks(codes4, s4, gs).to(torch.float64) - ref).square().sum(-1)
        use4 = err4 < err6
        codes = torch.where(use4.unsqueeze(-1), codes4, codes6)
        s = torch.where(use4, s4, s6)
    packed = pack_nibbles(codes.reshape(x.shape))  # [..., K/2]
    return NVFP4Tensor(packed=packed, scales=e4m3_to_bytes(s), global_scale=gs)
