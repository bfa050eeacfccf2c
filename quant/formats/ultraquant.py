"""vLLM 0.32's UltraQuant KV cache (`ultraquant_4bit`): FP4 E2M1 codes with one UE8M0 (power-of-two) scale
per group of 32 elements, K Hadamard-rotated before it is quantized, V stored as it is.

Emulated as vLLM's store kernel writes it (v1/attention/ops/ultraquant/triton_store.py
`_ultraquant_store_kernel`) and its read-back gives it (triton_dequant.py `_ultraquant_full_dequant_kv`; the
decode kernel triton_unified_attention.py decodes the same bytes to the same values), one (token, head) row
of D elements at a time, in float32:

- K only: the rotation is an in-register Walsh-Hadamard butterfly, log2(D) stages each computing
  (+-x[i] + x[i ^ 2**s]) * fl32(1/sqrt(2)) (lower index: a + b, upper: a - b), so K ends in the basis of the
  orthonormal Sylvester Hadamard matrix H_D / sqrt(D) (the same for every layer, no random signs).
- Per group of 32: a = max |x|, s_raw = a * fl32(0.156), e = floor(log2(s_raw) + 0.5) (a group with a = 0
  takes e = 0 and stores byte 0), divisor 2**e, y = x / 2**e (exact), sorted index = the number of E2M1
  midpoints (+-0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) strictly below y: nearest E2M1 value, a tie going to the
  LOWER value (-0.25 -> -0.5, 0.25 -> 0), |y| > 5 saturating at 6 (y reaches about 9: the snap can halve
  s by sqrt(2)); never -0. Stored: the E2M1 code (sign bit 3), element 2i in the low nibble, and the byte
  e + 127, or 0 where e + 127 falls outside 0..255 (byte 0 reads back as zero here and in the dequant
  kernel; the decode's scaled dot takes it as 2**-127, which differs only where e <= -127 left codes).
- Read back: E2M1 value * 2**(byte - 127) (0 for byte 0), exact in float32 and in bfloat16. K stays in the
  rotated basis in the cache (attention rotates Q by the same H); `dequantize` rotates it back by H (float32,
  H symmetric), so q . k here is (q H) . k_rot there.
- Slot per (token, head): [K codes D/2 | K scales D/32 | V codes D/2 | V scales D/32], no padding:
  D + D/16 bytes for K and V together, 4.25 bits per element. D must be a power of two >= 32.

Not emulated here (attention, not the cache): the decode kernel casts the rotated Q to FP8 E4M3
(q_rot.to(torch.float8_e4m3fn), no scale, saturating at 448) and P to bfloat16 before P V; a large
continuation chunk reads the dequantized cache in bfloat16 with Q rotated in bfloat16. vLLM's first prefill
chunk attends the fresh K and V (flash attention): the hf engine's `prefill_reads_quantized = false`.

Where a GPU could differ from this (and from the Triton interpreter the fixtures come from): tl.log2 is an
approximate lg2 on NVIDIA / AMD, so a rotated K group whose s_raw lies within about 2**-22 of a rounding
boundary (2**n sqrt(2)) may snap to the other power of two (V groups cannot: for bfloat16 and float16 input
every s_raw lies at least 4.7e-4 in log2 from a boundary, measured over all their finite values); tl.exp2 may
flush a subnormal divisor 2**e to zero (e <= -127: groups with max |x| below about 2**-124), which changes
the stored codes but not the values read back (such a group's byte is 0). Nothing else can differ: a fused
multiply-add of +-1 * a + b rounds as the two operations do, and dividing by a normal power of two is exact
whichever division the GPU uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from quant.errors import QuantError
from quant.formats.fp8 import check_finite
from quant.formats.minifloat import E2M1_VALUES, pack_nibbles, unpack_nibbles
from quant.formats.quantized import QuantizedTensor
from quant.formats.split import SplitKVFormat
from quant.formats.turboquant import hadamard

NAME = "ultraquant_4bit"
GROUP_SIZE = 32  # vLLM's GROUP_SIZE: one UE8M0 scale per 32 elements
CONSTANT_C = 0.156  # vLLM's DEFAULT_CONSTANT_C: s_raw = c * max |x| (the kernel multiplies by fl32(c))
UE8M0_BIAS = 127
INV_SQRT2 = 0.7071067811865476  # the butterfly's per-stage factor (the kernel multiplies by fl32 of it)
# E2M1 midpoints in ascending order (vLLM's MIDPOINTS_SORTED): sorted index = how many lie strictly below y
MIDPOINTS: tuple[float, ...] = (
    -5.0, -3.5, -2.5, -1.75, -1.25, -0.75, -0.25, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0,
)
ZERO_INDEX = 7  # sorted index of +0.0


def _rows(x: torch.Tensor, what: str) -> torch.Tensor:
    """x [..., D] as float32 after the checks the kernel's shapes impose (D a power of two >= 32)."""
    check_finite(x, what)
    d = x.shape[-1] if x.dim() else 0
    if d < GROUP_SIZE or d & (d - 1):
        raise QuantError(f"{what} needs head_dim a power of two >= {GROUP_SIZE} (vLLM's store kernel), "
                         f"got {d}")
    return x.to(torch.float32)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """The store kernel's Walsh-Hadamard butterfly of float32 x [..., D] (D a power of two): x H_D / sqrt(D),
    rounded as the kernel rounds it (a multiply by fl32(1/sqrt(2)) after every stage)."""
    d = x.shape[-1]
    inv_sqrt2 = torch.tensor(INV_SQRT2, dtype=torch.float32)
    h = 1
    while h < d:
        xv = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)  # [..., D/2h, 2, h]: index bit h clear | set
        lo, hi = xv[..., 0, :], xv[..., 1, :]
        x = (torch.stack([lo + hi, lo - hi], dim=-2) * inv_sqrt2).reshape(x.shape)
        h <<= 1
    return x


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed, scales) of float32 x [..., D]: E2M1 codes uint8 [..., D/2] (element 2i low nibble) and UE8M0
    bytes uint8 [..., D/32], as the store kernel computes them after its (optional) rotation."""
    lead, d = x.shape[:-1], x.shape[-1]
    g = x.reshape(*lead, d // GROUP_SIZE, GROUP_SIZE)  # [..., G, 32]
    amax = g.abs().amax(dim=-1)  # [..., G]
    zero = amax == 0
    s_raw = torch.where(zero, 1.0, amax * torch.tensor(CONSTANT_C, dtype=torch.float32))
    exp = torch.floor(torch.log2(s_raw) + 0.5).to(torch.int32)  # round half up
    divisor = torch.where(zero, 1.0, torch.exp2(exp.to(torch.float32)))
    y = g / divisor.unsqueeze(-1)
    mids = torch.tensor(MIDPOINTS, dtype=torch.float32, device=x.device)
    idx = torch.searchsorted(mids, y.contiguous(), right=False).to(torch.int32)  # midpoints < y
    idx = torch.where(zero.unsqueeze(-1), ZERO_INDEX, idx)
    codes = torch.where(idx < ZERO_INDEX, 15 - idx, idx - ZERO_INDEX)  # sorted index -> E2M1 bits
    byte = torch.where(zero, 0, exp + UE8M0_BIAS)
    byte = torch.where((byte < 0) | (byte > 255), 0, byte)
    return pack_nibbles(codes.reshape(*lead, d).to(torch.uint8)), byte.to(torch.uint8)


def dequantize_groups(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """E2M1 value * 2**(byte - 127), 0 where the byte is 0: float32 [..., D] (the rotated basis for K)."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    values = lut[unpack_nibbles(packed).long()]  # [..., D]
    b = scales.to(torch.int32)
    s = torch.where(b == 0, 0.0, torch.exp2((b - UE8M0_BIAS).to(torch.float32)))  # [..., G]
    g = values.reshape(*values.shape[:-1], s.shape[-1], -1) * s.unsqueeze(-1)
    return g.reshape(values.shape)


def unrotate(k_rot: torch.Tensor) -> torch.Tensor:
    """K read back in x's basis: k_rot @ (H_D / sqrt(D)) in float32 (H is symmetric and orthonormal)."""
    d = k_rot.shape[-1]
    return (k_rot.reshape(-1, d) @ hadamard(d).to(k_rot.device)).reshape(k_rot.shape)


@dataclass(frozen=True)
class UltraQuantHalf:
    """One side (K, rotated, or V) of `ultraquant_4bit` as a KV format."""

    name: str
    side: Literal["k", "v"]
    bits_per_element: float = 4.0 + 8 / GROUP_SIZE  # 4.25: E2M1 + one UE8M0 byte per 32
    needs_tensor_scale: bool = False

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """vLLM's UltraQuant store of x [..., D] for this side (scale ignored: self-scaled per group)."""
        xf = _rows(x, f"{self.name} {self.side.upper()}")
        packed, scales = quantize_groups(rotate(xf) if self.side == "k" else xf)
        return QuantizedTensor(self.name, tuple(x.shape), {"packed": packed, "scales": scales}, None)

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values vLLM's read-back gives for this side, K rotated back to x's basis, in `dtype`."""
        if q.format != self.name:
            raise QuantError(f"cannot dequantize a {q.format!r} tensor with format {self.name!r}")
        values = dequantize_groups(q.data["packed"], q.data["scales"])
        return (unrotate(values) if self.side == "k" else values).to(dtype)

    def decode_scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """1.0: UltraQuant scales each group itself."""
        return torch.ones_like(amax, dtype=torch.float32)


@dataclass(frozen=True)
class UltraQuantFormat(SplitKVFormat):
    """`ultraquant_4bit`: `quantize` / `dequantize` are K's (`k_format`), V goes through `v_format`
    (`quant.formats.registry.kind_format` picks the side for a stream)."""

    name: str = NAME
    bits_per_element: float = 4.0 + 8 / GROUP_SIZE  # 4.25 for K and V alike, no slot padding
    needs_tensor_scale: bool = False

    @property
    def k_format(self) -> UltraQuantHalf:
        """K's quantizer: Hadamard rotation, then FP4 + UE8M0 (named as the format)."""
        return UltraQuantHalf(self.name, "k")

    @property
    def v_format(self) -> UltraQuantHalf:
        """V's quantizer: FP4 + UE8M0 without a rotation (named as the format)."""
        return UltraQuantHalf(self.name, "v")


def slot_bytes(head_dim: int) -> int:
    """vLLM's slot_size: K and V codes and their UE8M0 scales of one (token, head), no padding."""
    return 2 * (head_dim // 2 + head_dim // GROUP_SIZE)
