"""Hand-built checkpoint folders with K/V scales, unit cases named for the convention they stand for, on the
tiny random model (tests.evals.hf_fixtures.save_tiny) with safetensors. Folders llm-compressor itself writes
are made by tests/llmc_folders.py (read in tests/quant/scales/test_llmcompressor_folders.py).

- `tensor_group_encode_folder` (nvfp4-encode): compressed-tensors' tensor_group global scale, per attention
  module only `k_global_scale` / `v_global_scale`, float32 [1], = generate_gparam = 448 * 6 / amax, under a
  kv_cache_scheme num_bits 4, float, tensor_group, group_size 16, dynamic "local" (initialize_qparams
  registers only the global scale for it). No writer run here stores this for a KV cache: llm-compressor
  0.14.0.1 refuses both tensor_group KV schemes (TypeError with dynamic false, "Group quantization cannot be
  applied to attention" with dynamic "local"), so this folder is the only case of that convention.
- `k_scale_folder`: `self_attn.k_scale` / `v_scale` float32 [1] (with zero points, as llm-compressor's KV
  checkpoints carry them) under a compressed-tensors per-tensor float kv_cache_scheme of `num_bits`, holding
  whatever numbers the test gives: 8 bits declares fp8-decode (amax/448), 4 bits nvfp4-global (amax/6).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.evals.hf_fixtures import save_tiny


def _with_quant_config(folder: Path, scheme: dict[str, object]) -> None:
    ct = pytest.importorskip("compressed_tensors.quantization")
    qc = ct.QuantizationConfig(config_groups={}, kv_cache_scheme=ct.QuantizationArgs(**scheme),
                               quantization_status="frozen").model_dump(mode="json")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": qc}, indent=2))


def _add_tensors(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    path = folder / "model.safetensors"
    save_file({**load_file(str(path)), **tensors}, str(path), metadata={"format": "pt"})


def tensor_group_encode_folder(folder: Path, k_amax: Sequence[float], v_amax: Sequence[float]) -> Path:
    """The tiny model with compressed-tensors tensor_group global scales (nvfp4-encode) for these amax."""
    helpers = pytest.importorskip("compressed_tensors.quantization.utils")
    save_tiny(folder)
    _with_quant_config(folder, {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                                "dynamic": "local", "symmetric": True})
    tensors = {}
    for kind, amax in (("k", k_amax), ("v", v_amax)):
        for i, a in enumerate(amax):
            t = torch.tensor([a], dtype=torch.float32)
            tensors[f"model.layers.{i}.self_attn.{kind}_global_scale"] = helpers.generate_gparam(-t, t)
    _add_tensors(folder, tensors)
    return folder


def k_scale_folder(folder: Path, k: Sequence[float], v: Sequence[float], num_bits: int) -> Path:
    """The tiny model with per-layer k_scale / v_scale numbers under a `num_bits` float kv_cache_scheme."""
    save_tiny(folder)
    _with_quant_config(folder, {"num_bits": num_bits, "type": "float", "strategy": "tensor", "dynamic": False,
                                "symmetric": True})
    tensors = {}
    for kind, values in (("k", k), ("v", v)):
        for i, x in enumerate(values):
            tensors[f"model.layers.{i}.self_attn.{kind}_scale"] = torch.tensor([x], dtype=torch.float32)
            tensors[f"model.layers.{i}.self_attn.{kind}_zero_point"] = torch.zeros(1, dtype=torch.float32)
    _add_tensors(folder, tensors)
    return folder
