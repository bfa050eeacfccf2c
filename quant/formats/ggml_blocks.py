"""llama.cpp's (ggml's) KV-cache block formats q8_0 and q4_0, its Hadamard rotation of K, V and Q, and
the q8 rounding of its CPU matmuls' activations.

Reference formulas (ggml/src/ggml-quants.c, `quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`):
- q8_0: blocks of 32 along head_dim; d = amax / 127 (float32), q = round(x / d) half away from zero
  (roundf), the block stores int8 q and fp16(d); value = q * fp16(d).
- q4_0: blocks of 32; m = the element of largest magnitude (signed), d = m / -8, q = min(15,
  trunc(x / d + 8.5)), stored as nibbles (element j low, j + 16 high) with fp16(d); value = (q - 8) * fp16(d).
  The code grid is -8..7 times d, so the block's largest-magnitude element lands on -8 * d exactly.
What the CPU backend runs (read in llama.cpp's ggml-cpu): the cache write (ggml_set_rows, type_traits_cpu
from_float) quantizes f32 K/V with `quantize_row_q4_0` = `quantize_row_q4_0_ref` (ggml-cpu/quants.c), so
q4_0 here is bit-exact with it (and with gguf's numpy quantizer); q8_0 K/V and flash attention's Q for a
quantized K (q_to_vec_dot) go through `quantize_row_q8_0`, on x86 the AVX/AVX2 one (arch/x86/quants.c):
x * (127 / amax) instead of x * (1 / (amax / 127)) and `_mm256_round_ps` (ties to even) instead of roundf.
`quantize_q8_0` does that by default; simd=False is the reference (bit-exact with gguf's quantizer).
llama.cpp rotates K, V and Q by a normalized Walsh-Hadamard matrix over
head_dim before a quantized cache stores them (`LLAMA_ATTN_ROT_DISABLE=1` turns it off); attention
then runs in the rotated basis, so the emulator stores H x and hands back H^T dequant(H x).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from quant.errors import QuantError
from quant.formats.registry import QuantizedTensor

GGML_BLOCK = 32  # QK8_0 = QK4_0 = 32 elements per block
Q8_0_QMAX = 127.0  # int8 codes -127..127 (ggml never writes -128)
Q4_0_QMIN = -8.0  # nibble codes 0..15 stand for -8..7
GGMLKind = Literal["q8_0", "q4_0"]
# bits per element: 8-bit (or 4-bit) codes + one fp16 scale per 32 elements
GGML_BITS: dict[str, float] = {"q8_0": 8 + 16 / GGML_BLOCK, "q4_0": 4 + 16 / GGML_BLOCK}


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] as float32 blocks [..., D / 32, 32]; QuantError unless D % 32 == 0."""
    d = x.shape[-1]
    if d % GGML_BLOCK:
        raise QuantError(f"ggml block formats need the last dimension to be a multiple of {GGML_BLOCK}, got {d}")
    if not bool(torch.isfinite(x).all()):
        raise QuantError("ggml block input holds NaN or Inf: a KV cache with non-finite values is a model bug")
    return x.to(torch.float32).reshape(*x.shape[:-1], d // GGML_BLOCK, GGML_BLOCK)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """1 / d where d != 0, else 0 (ggml's `id = d ? 1.0f/d : 0.0f`)."""
    return torch.where(d != 0, 1.0 / torch.where(d != 0, d, 1.0), 0.0)


def quantize_q8_0(x: torch.Tensor, simd: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes [..., D], fp16 block scales [..., D / 32]) of x [..., D]: x86 SIMD rounding, or the reference's."""
    b = _blocks(x)
    amax = b.abs().amax(dim=-1, keepdim=True)  # [..., D/32, 1] float32
    d = amax / Q8_0_QMAX
    if simd:  # x86 quantize_row_q8_0: x * (127 / amax), rounded to nearest, ties to even
        # a float32 division (a python scalar / tensor would be 127 * (1 / amax), rounded twice)
        inv = torch.full_like(amax, Q8_0_QMAX) / torch.where(amax != 0, amax, 1.0)
        q = torch.round(b * torch.where(amax != 0, inv, 0.0))
    else:  # quantize_row_q8_0_ref: x * (1 / d), roundf (half away from zero)
        y = b * _inverse(d)
        q = torch.sign(y) * torch.floor(y.abs() + 0.5)
    return q.to(torch.int8).reshape(x.shape), d.squeeze(-1).to(torch.float16)


def quantize_q4_0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed nibbles uint8 [..., D / 2], fp16 block scales [..., D / 32]) of x [..., D]."""
    b = _blocks(x)
    idx = b.abs().argmax(dim=-1, keepdim=True)  # first element of largest magnitude, as ggml's loop
    m = torch.gather(b, -1, idx)  # [..., D/32, 1], signed
    d = m / Q4_0_QMIN
    q = torch.trunc(b * _inverse(d) + 8.5).clamp(0, 15).to(torch.uint8)  # [..., D/32, 32]
    packed = q[..., : GGML_BLOCK // 2] | (q[..., GGML_BLOCK // 2 :] << 4)  # element j low, j + 16 high
    return packed.reshape(*x.shape[:-1], x.shape[-1] // 2), d.squeeze(-1).to(torch.float16)


def dequantize_q8_0(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q * fp16(d) of q8_0 codes [..., D] and scales [..., D / 32]."""
    q = codes.to(torch.float32).reshape(*codes.shape[:-1], -1, GGML_BLOCK)
    return (q * scales.to(torch.float32)[..., None]).reshape(codes.shape).to(dtype)


def dequantize_q4_0(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(q - 8) * fp16(d) of q4_0 nibbles [..., D / 2] and scales [..., D / 32]."""
    p = packed.reshape(*packed.shape[:-1], -1, GGML_BLOCK // 2)
    q = torch.cat([p & 0x0F, p >> 4], dim=-1).to(torch.float32) + Q4_0_QMIN  # [..., D/32, 32]
    out = q * scales.to(torch.float32)[..., None]
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2).to(dtype)


def round_q8_0(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] rounded through q8_0 (what ggml's CPU flash attention does to Q for a quantized K)."""
    codes, scales = quantize_q8_0(x)
    return dequantize_q8_0(codes, scales, x.dtype)


def round_matmul_inputs(model: torch.nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
    """Hooks rounding every nn.Linear input through q8_0 blocks, as ggml's CPU matmul does for q4/q8 weights."""

    # ggml-cpu mul_mat converts f32 activations to the weight type's vec_dot_type before the dot products:
    # q8_1 for Q4_1, q8_0 for Q4_0 / Q8_0 weights, the same blocks of 32 and x86 rounding (q8_1's extra
    # fp16 block sum, used for Q4_1's offset term, is not modelled)
    def hook(module: torch.nn.Module, args: tuple) -> tuple:
        return (round_q8_0(args[0]), *args[1:])

    return [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Linear)]


_HADAMARD: dict[tuple[int, torch.device], torch.Tensor] = {}


def hadamard(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The normalized (orthonormal, symmetric) Sylvester-Walsh-Hadamard matrix [n, n], float32; n a power of 2."""
    if n < 1 or n & (n - 1):
        raise QuantError(f"a Hadamard rotation needs a power-of-two head_dim, got {n}")
    key = (n, torch.device(device))
    h = _HADAMARD.get(key)
    if h is None:
        h = torch.ones(1, 1)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        h = (h / math.sqrt(n)).to(key[1])
        _HADAMARD[key] = h
    return h


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] @ H (float32): the rotated basis; H is its own inverse, so rotate(rotate(x)) == x."""
    return x.to(torch.float32) @ hadamard(x.shape[-1], x.device)


@dataclass(frozen=True)
class GGMLFormat:
    """`q8_0` / `q4_0` as a KV format (self-scaled per 32-element block; no tensor scale)."""

    name: GGMLKind
    bits_per_element: float
    needs_tensor_scale: bool = False

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """ggml blocks of x [..., D] (scale ignored: self-scaled)."""
        codes, scales = quantize_q8_0(x) if self.name == "q8_0" else quantize_q4_0(x)
        key = "codes" if self.name == "q8_0" else "packed"
        return QuantizedTensor(self.name, tuple(x.shape), {key: codes, "scales": scales}, None)

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Block values of q in `dtype`."""
        if q.format != self.name:
            raise QuantError(f"cannot dequantize a {q.format!r} tensor with format {self.name!r}")
        if self.name == "q8_0":
            return dequantize_q8_0(q.data["codes"], q.data["scales"], dtype)
        return dequantize_q4_0(q.data["packed"], q.data["scales"], dtype)

    def decode_scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """1.0: ggml blocks have no tensor-level scale."""
        return torch.ones_like(amax, dtype=torch.float32)


GGML_FORMATS: dict[str, GGMLFormat] = {
    name: GGMLFormat(name=name, bits_per_element=bits) for name, bits in GGML_BITS.items()  # type: ignore[misc]
}
