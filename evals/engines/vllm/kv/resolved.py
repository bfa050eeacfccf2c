"""The engine's resolved configuration checked for the paths that would bypass the qa_kv rewrite (vLLM 0.32,
read in its source), so an arm is refused at model load, before any item, instead of running unemulated:

- decode context parallelism (`ParallelConfig.decode_context_parallel_size` > 1): the flash_attn and
  flashinfer DCP paths attend the step's new tokens to the fresh K/V, not to what the cache stored;
- a quantized KV cache resolved from `kv_cache_dtype = "auto"` (a checkpoint's compressed-tensors
  `kv_cache_scheme` makes `Attention.__init__` pick fp8): the emulated values would be quantized again;
  every layer's resolved `kv_cache_dtype` and `CacheConfig.cache_dtype` must store the model's precision;
- the compile passes that write the cache in a fused kernel the plugin does not wrap, which run only under
  `CompilationMode.VLLM_COMPILE` (compilation/passes/pass_manager.py): `fuse_rope_kvcache_cat_mla` (MLA's
  `fused_rope_unified_mla_kv_cache_update` -> `concat_and_cache_mla_rope_fused`, on by default when the KV
  update is not a splitting op: `splitting_ops = []` or inductor graph partition, config/vllm.py
  `enable_rope_kvcache_mla_fusion`), and ROCm's `fuse_rope_kvcache` (`do_rope_and_kv_cache_update`) and
  `fuse_qk_norm_rope_kvcache` (an AITER kernel that writes the cache itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evals.engines.vllm.kv.spec import UNQUANTIZED_DTYPES

VLLM_COMPILE = 3  # vllm.config.compilation.CompilationMode.VLLM_COMPILE: the only mode that runs the passes
# pass_config flag -> (which layers it concerns, what it fuses)
FUSED_WRITES: dict[str, tuple[str, str]] = {
    "fuse_rope_kvcache_cat_mla": ("mla", "MLA's fused rope + cache write (concat_and_cache_mla_rope_fused)"),
    "fuse_rope_kvcache": ("attention", "ROCm's rope + KV-cache fusion (do_rope_and_kv_cache_update)"),
    "fuse_qk_norm_rope_kvcache": ("attention", "ROCm's QK-norm + rope + KV-cache kernel"),
}


def bypass(vllm_config: Any, layer_dtypes: Mapping[str, str], *, mha: bool, mla: bool) -> str | None:
    """Why the resolved `vllm_config` would let K/V reach the cache or the attention without the rewrite
    (one clause), None when every write goes through it; `layer_dtypes`: each rewritten layer's resolved
    kv_cache_dtype by name; `mha` / `mla`: whether the model has Attention / MLAAttention layers."""
    dcp = int(getattr(vllm_config.parallel_config, "decode_context_parallel_size", 1) or 1)
    if dcp > 1:
        return (f"decode_context_parallel_size {dcp}: vLLM's DCP attention reads the step's fresh K/V, not the "
                "emulated cache; run with decode context parallelism 1")
    cache_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto"))
    quantized = {name: d for name, d in layer_dtypes.items() if d not in UNQUANTIZED_DTYPES}
    if cache_dtype not in UNQUANTIZED_DTYPES or quantized:
        name, dtype = next(iter(quantized.items()), ("the cache", cache_dtype))
        return (f"vLLM resolved {name}'s KV cache to {dtype} (kv_cache_dtype auto takes a checkpoint's own KV "
                "quantization): the emulated values would be quantized again; set kv_cache_dtype to the "
                "model's dtype (e.g. bfloat16) or use a checkpoint without a kv_cache_scheme")
    compilation = vllm_config.compilation_config
    if int(getattr(compilation, "mode", 0) or 0) != VLLM_COMPILE:
        return None
    passes = compilation.pass_config
    for flag, (kind, what) in FUSED_WRITES.items():
        if getattr(passes, flag, False) and (mla if kind == "mla" else mha):
            return (f"compilation pass {flag} is on: {what} writes the cache in a kernel the plugin does not "
                    f"wrap; set compilation_config = {{ pass_config = {{ {flag} = false }} }}")
    return None


def layer_kv_dtypes(layers: list[tuple[str, Any]]) -> dict[str, str]:
    """Each attention layer's resolved kv_cache_dtype (vLLM sets it in the layer's __init__), by name."""
    return {name: str(getattr(module, "kv_cache_dtype", "auto")) for name, module in layers}
