"""Checkpoint folders with K/V scales as other tools write them, built in tests on the tiny random model
(tests.evals.hf_fixtures.save_tiny) with safetensors, the way their saving code lays them out.

- `llmcompressor_nvfp4_folder`: llm-compressor / compressed-tensors NVFP4 KV (kv_cache_scheme num_bits 4,
  float, tensor_group, group_size 16, dynamic "local"): per attention module only `k_global_scale` /
  `v_global_scale`, float32 [1], = compressed-tensors' generate_gparam = 448 * 6 / amax
  (compressed_tensors/quantization/lifecycle/initialize.py registers only the global scale for a locally
  dynamic tensor_group scheme; llmcompressor/modifiers/quantization/calibration.py update_qparams stores
  only it), saved in model.safetensors next to the weights, the config written by QuantizationConfig.
- `k_scale_folder`: `self_attn.k_scale` / `v_scale` float32 [1] (with zero points, as llm-compressor's FP8
  KV checkpoints carry them) under a compressed-tensors kv_cache_scheme of `num_bits`, holding whatever
  numbers the test gives (FP8's amax/448, or a tool's "global scale" amax/6 under a 4-bit scheme).
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


def llmcompressor_nvfp4_folder(folder: Path, k_amax: Sequence[float], v_amax: Sequence[float]) -> Path:
    """The tiny model saved as llm-compressor saves an NVFP4-KV checkpoint whose observers saw these amax."""
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
    scheme: dict[str, object] = ({"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                  "symmetric": True} if num_bits == 8 else
                                 {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                                  "dynamic": "local", "symmetric": True})
    _with_quant_config(folder, scheme)
    tensors = {}
    for kind, values in (("k", k), ("v", v)):
        for i, x in enumerate(values):
            tensors[f"model.layers.{i}.self_attn.{kind}_scale"] = torch.tensor([x], dtype=torch.float32)
            tensors[f"model.layers.{i}.self_attn.{kind}_zero_point"] = torch.zeros(1, dtype=torch.float32)
    _add_tensors(folder, tensors)
    return folder
