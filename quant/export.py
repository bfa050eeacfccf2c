"""Export calibrated KV scales in the layouts serving engines read.

- vLLM: a safetensors file of float32 scalars `model.layers.{i}.self_attn.k_scale` / `v_scale` in the
  *decode* convention (x ~ stored * k_scale; vLLM's KV store uses gs = 1 / k_scale), the names vLLM's
  weight loader remaps onto `...self_attn.attn.k_scale`. Put the file in the model folder (and, if the
  folder has a `model.safetensors.index.json`, list the names in its weight_map). vLLM keeps one scale
  per layer: head-granular scales are exported as their maximum over heads (the scale that covers
  every head's amax without saturating).
- compressed-tensors: the `kv_cache_scheme` block of `quantization_config` in config.json (JSON), next
  to the same scale tensors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import torch

from quant.errors import QuantError
from quant.fileio import atomic_write_bytes
from quant.scales import KVScales

ExportTarget = Literal["vllm", "compressed-tensors"]
EXPORT_TARGETS: tuple[str, ...] = ("vllm", "compressed-tensors")
LAYER_PREFIX = "model.layers"  # decoder layer path of llama-style and Gemma-3 text checkpoints
SCALES_FILE = "kv_scales.safetensors"
SCHEME_FILE = "kv_cache_scheme.json"


def vllm_scale_tensors(scales: KVScales, layer_prefix: str = LAYER_PREFIX) -> dict[str, torch.Tensor]:
    """{`<prefix>.{i}.self_attn.k_scale` | `v_scale`: float32 scalar decode scale} for every layer."""
    out: dict[str, torch.Tensor] = {}
    for kind, t in (("k", scales.k_scale), ("v", scales.v_scale)):
        per_layer = t.amax(dim=-1) if t.dim() == 2 else t  # [L]: max over heads when head-granular
        for i in range(per_layer.shape[0]):
            out[f"{layer_prefix}.{i}.self_attn.{kind}_scale"] = per_layer[i].to(torch.float32).clone()
    return out


def kv_cache_scheme(scales: KVScales) -> dict[str, Any]:
    """compressed-tensors QuantizationArgs (JSON) of the KV cache the scales were calibrated for."""
    fmt, head = scales.meta.format, scales.meta.granularity == "head"
    if fmt in ("fp8_e4m3", "fp8_e5m2"):
        if fmt == "fp8_e5m2":
            raise QuantError(
                "compressed-tensors describes FP8 KV caches as E4M3 only; calibrate with --format fp8_e4m3"
            )
        return {
            "num_bits": 8,
            "type": "float",
            "strategy": "attn_head" if head else "tensor",
            "dynamic": False,
            "symmetric": True,
        }
    if fmt == "nvfp4":
        if head:
            raise QuantError(
                "compressed-tensors NVFP4 (tensor_group) has one global scale per tensor; "
                "calibrate with --granularity tensor"
            )
        # block scales are computed on write (dynamic "local"), the global scale is the static k/v_scale
        return {
            "num_bits": 4,
            "type": "float",
            "strategy": "tensor_group",
            "group_size": 16,
            "dynamic": "local",
            "symmetric": True,
            "scale_dtype": "torch.float8_e4m3fn",
        }
    raise QuantError(
        f"format {fmt!r} has no compressed-tensors kv_cache_scheme; export fp8_e4m3 or nvfp4 scales"
    )


def _write_tensors(tensors: dict[str, torch.Tensor], path: Path, scales: KVScales) -> Path:
    from safetensors.torch import save

    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": scales.meta.format,
        "convention": scales.meta.convention,
        "granularity": scales.meta.granularity,
        "observer": scales.meta.observer,
    }
    atomic_write_bytes(path, save(tensors, metadata=meta))
    return path


def export_scales(
    scales: KVScales, target: ExportTarget, out_dir: Path, layer_prefix: str = LAYER_PREFIX
) -> list[Path]:
    """Write the files of `target` into out_dir; returns their paths."""
    if target not in EXPORT_TARGETS:
        raise QuantError(f"unknown export target {target!r}; choose one of: {', '.join(EXPORT_TARGETS)}")
    out_dir = Path(out_dir)
    block = {"kv_cache_scheme": kv_cache_scheme(scales)} if target == "compressed-tensors" else None
    paths = [_write_tensors(vllm_scale_tensors(scales, layer_prefix), out_dir / SCALES_FILE, scales)]
    if block is not None:
        scheme_path = out_dir / SCHEME_FILE
        atomic_write_bytes(scheme_path, (json.dumps(block, indent=2) + "\n").encode())
        paths.append(scheme_path)
    return paths
