"""vLLM 0.32's TurboQuant KV caches (`turboquant_k8v4`, `turboquant_4bit_nc`, `turboquant_k3v4_nc`,
`turboquant_3bit_nc`): K and V stored differently, in one packed slot per (token, head).

Emulated as vLLM's store writes them (v1/attention/ops/triton_turboquant_store.py and its launcher's
torch prologue) and its decode kernel reads them back (v1/attention/ops/triton_turboquant_decode.py):

- K, MSE presets (3 or 4 bits): n = ||k|| (float32), y = (k / (n + 1e-8)) @ H with H the orthonormal
  Sylvester Hadamard matrix H_D / sqrt(D) (the same for every layer: vLLM uses no random signs here),
  index = the number of codebook midpoints <= y (the kernel's binary search), packed 2 per byte (4-bit) or
  8 per 3 bytes little-endian (3-bit), then n as float16. The codebook is vLLM's Lloyd-Max solution for
  N(0, 1/D) (`lloyd_max`, the same float64 iteration as vLLM's centroids.py). Read back: c = codebook[idx],
  with norm correction (`_nc` presets) c / sqrt(sum c^2 + 1e-16), times n, rotated back by H.
- K, `k8v4`: an unscaled FP8 E4M3 cast of k (round to nearest even, saturating at 448).
- V: uniform asymmetric per row: s = max((max - min) / L, 1e-8) (L = 15 or 7), code = clamp(floor((v -
  min) / s + 0.5), 0, L), packed as K's indices; s and min stored as float16. Read back: code * s + min
  from those float16 numbers.

vLLM's first prefill chunk attends the fresh K and V (flash attention on the unquantized tensors); only
later tokens read the cache: the hf engine's `prefill_reads_quantized = false` is that behaviour.

Where a GPU could differ: the rotation y = x_hat @ H is a cuBLAS float32 GEMM that runs in TF32 when
torch.backends.cuda.matmul.allow_tf32 is set, and ||k|| is reduced in another order; Triton's float32
division may be approximate on NVIDIA ((v - min) / s); code * s + min may be one fused multiply-add; the
norm correction's sum of squares is a tree reduction; SM < 8.9 GPUs store K8 as fp8e4b15, not E4M3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import torch

from quant.errors import QuantError
from quant.formats.catalog import TURBOQUANT_PRESETS
from quant.formats.fp8 import check_finite
from quant.formats.quantized import QuantizedTensor
from quant.formats.split import SplitKVFormat

TurboQuantName = Literal["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"]
NORM_EPS = 1e-8  # k / (||k|| + 1e-8) before the rotation
NC_EPS = 1e-16  # 1 / sqrt(sum c^2 + 1e-16) in the norm correction
V_MIN_SCALE = 1e-8  # the store's floor on a value row's scale
FP8_MAX = 448.0  # E4M3 largest finite value: Triton's e4nv cast saturates here (cvt.rn.satfinite)


@dataclass(frozen=True)
class TurboQuantPreset:
    """One TurboQuant preset (vLLM's TQ_PRESETS): K bits (8 = FP8), V bits, norm correction."""

    key_bits: int
    value_bits: int
    norm_correction: bool

    def key_bytes(self, head_dim: int) -> int:
        """Stored K bytes per (token, head): D FP8 bytes, or packed indices + a float16 norm."""
        return head_dim if self.key_bits == 8 else math.ceil(head_dim * self.key_bits / 8) + 2

    def value_bytes(self, head_dim: int) -> int:
        """Stored V bytes per (token, head): packed codes + float16 scale + float16 zero."""
        return math.ceil(head_dim * self.value_bits / 8) + 4

    def slot_bytes(self, head_dim: int) -> int:
        """vLLM's slot_size_aligned: K + V bytes rounded up to an even count."""
        s = self.key_bytes(head_dim) + self.value_bytes(head_dim)
        return s + s % 2


PRESETS: dict[str, TurboQuantPreset] = {name: TurboQuantPreset(*p) for name, p in TURBOQUANT_PRESETS.items()}


def _trapz(f: object, a: float, b: float, n: int = 200) -> float:
    """vLLM's trapezoidal rule, term for term (so the codebook comes out bit-identical)."""
    h = (b - a) / n
    result = 0.5 * (f(a) + f(b))  # type: ignore[operator]
    for i in range(1, n):
        result += f(a + i * h)  # type: ignore[operator]
    return result * h


@lru_cache(maxsize=16)
def lloyd_max(d: int, bits: int, max_iter: int = 200, tol: float = 1e-10) -> tuple[float, ...]:
    """Lloyd-Max centroids (ascending, float64) for N(0, 1/d) with 2**bits levels: vLLM's solve_lloyd_max."""
    n_levels = 2**bits
    sigma2 = 1.0 / d
    sigma = math.sqrt(sigma2)

    def pdf(x: float) -> float:
        return (1.0 / math.sqrt(2 * math.pi * sigma2)) * math.exp(-x * x / (2 * sigma2))

    lo, hi = -3.5 * sigma, 3.5 * sigma
    centroids = [lo + (hi - lo) * (i + 0.5) / n_levels for i in range(n_levels)]
    for _ in range(max_iter):
        boundaries = [(centroids[i] + centroids[i + 1]) / 2.0 for i in range(n_levels - 1)]
        edges = [lo * 3] + boundaries + [hi * 3]
        new = []
        for i in range(n_levels):
            a, b = edges[i], edges[i + 1]
            num = _trapz(lambda x: x * pdf(x), a, b)
            den = _trapz(pdf, a, b)
            new.append(num / den if den > 1e-15 else centroids[i])
        if max(abs(new[i] - centroids[i]) for i in range(n_levels)) < tol:
            break
        centroids = new
    return tuple(centroids)


def codebook(d: int, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(centroids [2**bits], midpoints [2**bits - 1]) in float32, as vLLM's layer buffers hold them."""
    c = torch.tensor(lloyd_max(d, bits), dtype=torch.float32)
    c_sorted, _ = c.sort()
    return c, (c_sorted[:-1] + c_sorted[1:]) / 2


def hadamard(d: int) -> torch.Tensor:
    """vLLM's rotation H_d / sqrt(d) (float32 [d, d], symmetric, orthonormal); d a power of two."""
    if d <= 0 or d & (d - 1):
        raise QuantError(f"TurboQuant rotates with a Hadamard matrix: head_dim must be a power of two, got {d}")
    h = torch.tensor([[1.0]])
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def pack_bits(idx: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack codes [..., D] of `bits` (3 or 4) into bytes: 4-bit 2 per byte (even index low), 3-bit 8 per
    3 bytes as one little-endian 24-bit word with code i at bit 3i."""
    idx = idx.to(torch.int32)
    d = idx.shape[-1]
    if bits == 4:
        pairs = idx.reshape(*idx.shape[:-1], d // 2, 2)  # [..., D/2, 2]
        return ((pairs[..., 0] & 0xF) | ((pairs[..., 1] & 0xF) << 4)).to(torch.uint8)
    groups = idx.reshape(*idx.shape[:-1], d // 8, 8) & 0x7  # [..., D/8, 8]
    word = (groups << (torch.arange(8, device=idx.device) * 3)).sum(dim=-1)  # [..., D/8]
    out = torch.stack([(word >> s) & 0xFF for s in (0, 8, 16)], dim=-1)  # [..., D/8, 3]
    return out.reshape(*idx.shape[:-1], d // 8 * 3).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    """Codes [..., d] (int64) from `pack_bits` output, read as the decode kernel does (two bytes, shift, mask)."""
    bit_off = torch.arange(d, device=packed.device) * bits
    byte = (bit_off // 8).clamp(max=packed.shape[-1] - 1)
    lo = packed.to(torch.int64)[..., byte]
    nxt = (bit_off // 8 + 1).clamp(max=packed.shape[-1] - 1)
    hi = torch.where(bit_off // 8 + 1 < packed.shape[-1], packed.to(torch.int64)[..., nxt], 0)
    return ((lo | (hi << 8)) >> (bit_off % 8)) & ((1 << bits) - 1)


def _check(x: torch.Tensor, bits: int, what: str) -> torch.Tensor:
    check_finite(x, what)
    d = x.shape[-1] if x.dim() else 0
    if d == 0 or d % (8 if bits == 3 else 2):
        raise QuantError(f"{what} with {bits}-bit codes needs head_dim a multiple of {8 if bits == 3 else 2}, got {d}")
    return x.to(torch.float32).reshape(-1, d)  # [N, D], the launcher's k.float().reshape(NH, D)


def quantize_values(v: torch.Tensor, bits: int) -> dict[str, torch.Tensor]:
    """V rows [..., D]: {"packed": uint8 [..., ceil(D bits / 8)], "scale": float16 [..., 1], "zero": float16 [..., 1]}."""
    vf = _check(v, bits, "TurboQuant V")
    levels = float(2**bits - 1)
    vmin = vf.amin(dim=-1, keepdim=True)
    scale = (vf.amax(dim=-1, keepdim=True) - vmin) / levels
    scale = torch.where(scale > V_MIN_SCALE, scale, V_MIN_SCALE)
    q = ((vf - vmin) / scale + 0.5).to(torch.int32).clamp(0, int(levels))
    lead = v.shape[:-1]
    return {"packed": pack_bits(q, bits).reshape(*lead, -1), "scale": scale.to(torch.float16).reshape(*lead, 1),
            "zero": vmin.to(torch.float16).reshape(*lead, 1)}


def dequantize_values(data: dict[str, torch.Tensor], bits: int, d: int) -> torch.Tensor:
    """code * scale + zero [..., D] in float32, from the float16 scale and zero the slot holds."""
    codes = unpack_bits(data["packed"], bits, d).to(torch.float32)
    return codes * data["scale"].to(torch.float32) + data["zero"].to(torch.float32)


def quantize_keys(k: torch.Tensor, bits: int) -> dict[str, torch.Tensor]:
    """K rows [..., D], MSE: {"indices": uint8 packed [..., ceil(D bits / 8)], "norm": float16 [..., 1]}."""
    kf = _check(k, bits, "TurboQuant K")
    d = kf.shape[-1]
    _, midpoints = codebook(d, bits)
    norms = kf.norm(dim=1, keepdim=True)  # [N, 1]
    y = (kf / (norms + NORM_EPS)) @ hadamard(d).to(kf.device)  # [N, D]
    idx = torch.searchsorted(midpoints.to(kf.device), y.contiguous(), right=True)  # midpoints <= y
    lead = k.shape[:-1]
    return {"indices": pack_bits(idx, bits).reshape(*lead, -1), "norm": norms.to(torch.float16).reshape(*lead, 1)}


def keys_rotated(data: dict[str, torch.Tensor], bits: int, d: int, norm_correction: bool) -> torch.Tensor:
    """n * c (norm-corrected for `_nc`): K [..., D] in float32 in the rotated basis, as the decode reads it."""
    centroids, _ = codebook(d, bits)
    c = centroids.to(data["indices"].device)[unpack_bits(data["indices"], bits, d)]  # [..., D]
    if norm_correction:
        c = c * (1.0 / torch.sqrt((c * c).sum(dim=-1, keepdim=True) + NC_EPS))
    return data["norm"].to(torch.float32) * c


def dequantize_keys(data: dict[str, torch.Tensor], bits: int, d: int, norm_correction: bool) -> torch.Tensor:
    """`keys_rotated` rotated back by H (q . k = (q H) . (k H)): K [..., D] in float32 in x's basis."""
    rotated = keys_rotated(data, bits, d, norm_correction)
    return (rotated.reshape(-1, d) @ hadamard(d).to(rotated.device)).reshape(rotated.shape)


@dataclass(frozen=True)
class TurboQuantHalf:
    """One side (K or V) of a TurboQuant preset as a KV format."""

    name: str
    preset: TurboQuantPreset
    side: Literal["k", "v"]
    needs_tensor_scale: bool = False

    @property
    def bits_per_element(self) -> float:
        """Stored bits per element of this side at head_dim 128 (norm, scale and zero included)."""
        nbytes = self.preset.key_bytes(128) if self.side == "k" else self.preset.value_bytes(128)
        return nbytes * 8 / 128

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """vLLM's TurboQuant store of x [..., D] for this side (scale ignored)."""
        p = self.preset
        if self.side == "v":
            data = quantize_values(x, p.value_bits)
        elif p.key_bits == 8:
            check_finite(x, "TurboQuant K")
            data = {"values": x.to(torch.float32).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)}
        else:
            data = quantize_keys(x, p.key_bits)
        return QuantizedTensor(self.name, tuple(x.shape), data, None)

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values vLLM's decode kernel reads for this side, in x's basis, in `dtype`."""
        if q.format != self.name:
            raise QuantError(f"cannot dequantize a {q.format!r} tensor with format {self.name!r}")
        p, d = self.preset, q.shape[-1]
        if ("zero" in q.data) != (self.side == "v"):
            raise QuantError(f"{self.name}: a {'V' if 'zero' in q.data else 'K'} slot read as {self.side.upper()}")
        if self.side == "v":
            return dequantize_values(q.data, p.value_bits, d).to(dtype)
        if p.key_bits == 8:
            return q.data["values"].to(torch.float32).to(dtype)
        return dequantize_keys(q.data, p.key_bits, d, p.norm_correction).to(dtype)

    def decode_scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """1.0: TurboQuant scales each row itself (K8 is an unscaled cast)."""
        return torch.ones_like(amax, dtype=torch.float32)


@dataclass(frozen=True)
class TurboQuantFormat(SplitKVFormat):
    """A TurboQuant preset: `quantize` / `dequantize` are K's (`k_format`), V goes through `v_format`
    (`quant.formats.registry.kind_format` picks the side for a stream)."""

    name: str
    preset: TurboQuantPreset
    needs_tensor_scale: bool = False

    @property
    def k_format(self) -> TurboQuantHalf:
        """K's quantizer (named as the preset)."""
        return TurboQuantHalf(self.name, self.preset, "k")

    @property
    def v_format(self) -> TurboQuantHalf:
        """V's quantizer (named as the preset)."""
        return TurboQuantHalf(self.name, self.preset, "v")

    @property
    def bits_per_element(self) -> float:
        """Stored bits per K and V element at head_dim 128, slot padding included."""
        return self.preset.slot_bytes(128) * 8 / 256
