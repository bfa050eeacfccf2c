"""Export calibrated KV scales in the layouts serving engines read.

- vLLM: a safetensors file of float32 scalars `model.layers.{i}.self_attn.k_scale` / `v_scale` in the
  *decode* convention (x ~ stored * k_scale; vLLM's KV store uses gs = 1 / k_scale), the names vLLM's
  weight loader remaps onto `...self_attn.attn.k_scale`. Put the file in the model folder (and, if the
  folder has a `model.safetensors.index.json`, list the names in its weight_map). vLLM keeps one scale
  per layer: head-granular scales are exported as their maximum over heads (the scale that covers
  every head's amax without saturating).
- compressed-tensors: the `kv_cache_scheme` block of `quantization_config` in config.json (JSON), next
  to the same scale tensors.
- a vLLM model folder (`export_model_folder`, FP8 E4M3 or NVFP4 scales): the model's files (weights and
  tokenizer hard-linked, or copied across file systems), config.json with a compressed-tensors
  `quantization_config` that quantizes no weights and declares an 8-bit float per-tensor `kv_cache_scheme`,
  the scale tensors, and `kv_scales_convention.json` saying what the numbers are (quant.scales.conventions), which
  `kv_cache_dtype` to run them with, and the calibration they came from. vLLM 0.32 loads k/v scales only
  through a quantization config (its AutoWeightsLoader then maps `...self_attn.k_scale` onto
  `...self_attn.attn.k_scale`; CompressedTensorsKVCacheMethod copies them unchanged into `_k_scale`, which
  the FP8 and the NVFP4 cache paths both read as the decode scale); without one every layer keeps 1.0 and
  nothing is logged. Its CompressedTensorsKVCacheMethod refuses a 4-bit kv_cache_scheme (NotImplementedError),
  so an NVFP4 folder carries its scales through the 8-bit scheme and must be run with
  `--kv-cache-dtype nvfp4`; the 4-bit scheme as compressed-tensors defines NVFP4 KV is written in the
  convention file (docs/NVFP4_KV_SCALES.md).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from quant.errors import QuantError
from quant.fileio import atomic_write_bytes, sha256_file
from quant.formats.catalog import EXPORT_TARGETS, ExportTarget  # names without torch: the CLI checks them
from quant.scales.conventions import CONVENTIONS, VLLM_FOLDER_FORMATS, Convention
from quant.scales.files import KVScales
from quant.scales.folder import CONVENTION_FILE, CONVENTION_SCHEMA_VERSION

LAYER_PREFIX = "model.layers"  # decoder layer path of llama-style and Gemma-3 text checkpoints
SCALES_FILE = "kv_scales.safetensors"
SCHEME_FILE = "kv_cache_scheme.json"
INDEX_FILE = "model.safetensors.index.json"
NOT_COPIED = frozenset({"SOURCE_SHA256"})  # the source's provenance stamp: the export is another model
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")  # any one: vLLM finds it
# the kv_cache_scheme vLLM 0.32's CompressedTensorsKVCacheMethod accepts (float, 8 bits, tensor, symmetric):
# the one through which it loads per-layer k/v scales, whatever kv_cache_dtype then reads them
CARRIER_SCHEME: dict[str, Any] = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                  "symmetric": True}
# quantization_config of a folder whose only quantization is the KV cache: no weight groups, dense
# weights; what llm-compressor writes for a KV-cache-only recipe
KV_ONLY_CONFIG: dict[str, Any] = {"quant_method": "compressed-tensors", "format": "dense", "config_groups": {},
                                  "ignore": [], "quantization_status": "frozen"}


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
    from safetensors.torch import save  # safetensors: only when an export is written

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


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed: a real copy
        shutil.copy2(src, dst)


def model_folder_config(config: dict[str, Any], scales: KVScales) -> dict[str, Any]:
    """config.json of the exported folder: the model's, plus a KV-only compressed-tensors quantization_config
    declaring the 8-bit kv_cache_scheme vLLM 0.32 loads the scales through (one scale per layer)."""
    if "quantization_config" in config:
        raise QuantError("the model already has a quantization_config; exporting KV scales into a quantized "
                         "checkpoint is not supported (add its kv_cache_scheme with the quantizer that made it)")
    layers = config.get("num_hidden_layers", config.get("text_config", {}).get("num_hidden_layers"))
    if layers is not None and int(layers) != scales.num_layers:
        raise QuantError(f"the scales cover {scales.num_layers} layers, the model has {layers}: "
                         "calibrate this model")
    return {**config, "quantization_config": {**KV_ONLY_CONFIG, "kv_cache_scheme": dict(CARRIER_SCHEME)}}


def folder_convention(scales: KVScales) -> Convention:
    """The convention the exported numbers are in; QuantError for a format vLLM's folder path does not take."""
    if scales.meta.format not in VLLM_FOLDER_FORMATS:
        raise QuantError(f"a vLLM model folder takes {', '.join(VLLM_FOLDER_FORMATS)} KV scales, not "
                         f"{scales.meta.format!r}: calibrate with --format fp8_e4m3 or nvfp4")
    return CONVENTIONS[VLLM_FOLDER_FORMATS[scales.meta.format][0]]


def convention_record(scales: KVScales, scales_file: Path, layer_prefix: str = LAYER_PREFIX) -> dict[str, Any]:
    """kv_scales_convention.json: what the numbers in `scales_file` are, how vLLM must run them, and the
    calibration they came from."""
    conv = folder_convention(scales)
    kv_dtype = VLLM_FOLDER_FORMATS[scales.meta.format][1]
    record: dict[str, Any] = {
        "schema_version": CONVENTION_SCHEMA_VERSION,
        "convention": conv.name, "formula": conv.formula, "meaning": conv.meaning, "format": scales.meta.format,
        "fields": {kind: f"{layer_prefix}.{{i}}.self_attn.{kind}_scale" for kind in "kv"},
        "file": scales_file.name, "scales_sha256": sha256_file(scales_file),
        "vllm": {"kv_cache_dtype": kv_dtype,
                 "loaded_through": "compressed-tensors kv_cache_scheme num_bits=8 (config.json), the scheme "
                                   "vLLM 0.32 loads per-layer k/v scales through",
                 "note": f"run with --kv-cache-dtype {kv_dtype}" + (
                     "; left at auto vLLM runs an fp8 cache with these NVFP4 scales (6x too small: every value "
                     "above amax / 6 saturates)" if conv.kv_format == "nvfp4" else "")},
        "calibration": scales.meta.model_dump(),
    }
    if conv.kv_format == "nvfp4":  # NVFP4 KV as compressed-tensors / llm-compressor define it
        record["compressed_tensors_kv_cache_scheme"] = kv_cache_scheme(
            scales if scales.meta.granularity == "tensor" else _tensor_meta(scales))
    return record


def _tensor_meta(scales: KVScales) -> KVScales:
    """`scales` restated per layer (max over heads): what a one-scale-per-layer folder holds."""
    meta = scales.meta.model_copy(update={"granularity": "tensor"})
    k, v, ks, vs = (t.amax(dim=-1) for t in (scales.k_amax, scales.v_amax, scales.k_scale, scales.v_scale))
    return KVScales(k_amax=k, v_amax=v, k_scale=ks, v_scale=vs, meta=meta)


def export_model_folder(scales: KVScales, model_dir: Path, out_dir: Path,
                        layer_prefix: str = LAYER_PREFIX) -> list[Path]:
    """Write a model folder vLLM loads with the calibrated KV scales (FP8 E4M3 or NVFP4; a head-granular file
    is exported per layer, max over heads) and the convention file; returns the files written."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    folder_convention(scales)
    config_path = model_dir / "config.json"
    if not config_path.is_file() or not list(model_dir.glob("*.safetensors")):
        raise QuantError(f"{model_dir}: not a safetensors model folder (config.json and *.safetensors)")
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise QuantError(f"{model_dir}: no tokenizer ({' / '.join(TOKENIZER_FILES)}); vLLM needs one in the folder")
    if out_dir.resolve() == model_dir.resolve():
        raise QuantError("--model-out must be a new folder, not the model's own")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise QuantError(f"{out_dir} is not an empty folder (an earlier export?); choose a new one or delete it")
    config = model_folder_config(json.loads(config_path.read_text(encoding="utf-8")), scales)
    tensors = vllm_scale_tensors(scales, layer_prefix)
    # built in a sibling folder and renamed at the end: a folder with a config.json is always complete
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    names: list[str] = []
    for src in sorted(p for p in model_dir.iterdir() if p.is_file() and p.name not in NOT_COPIED):
        if src.name == CONVENTION_FILE:
            continue  # the source's own scales convention says nothing about these scales
        dst = partial / src.name
        if src.name == "config.json":
            atomic_write_bytes(dst, (json.dumps(config, indent=2) + "\n").encode())
        elif src.name == INDEX_FILE:  # sharded weights: the scales file must be listed too
            index = json.loads(src.read_text(encoding="utf-8"))
            index["weight_map"] = {**index.get("weight_map", {}), **dict.fromkeys(tensors, SCALES_FILE)}
            atomic_write_bytes(dst, (json.dumps(index, indent=2) + "\n").encode())
        else:
            _link_or_copy(src, dst)
        names.append(src.name)
    scales_path = _write_tensors(tensors, partial / SCALES_FILE, scales)
    record = convention_record(scales, scales_path, layer_prefix)
    atomic_write_bytes(partial / CONVENTION_FILE, (json.dumps(record, indent=2) + "\n").encode())
    if out_dir.is_dir() and not any(out_dir.iterdir()):
        out_dir.rmdir()  # an empty folder the user made for it
    os.replace(partial, out_dir)
    return [out_dir / name for name in [*names, SCALES_FILE, CONVENTION_FILE]]
