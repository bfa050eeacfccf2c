"""Calibrate -> export -> load, closed, on vLLM-CPU: SmolLM2-135M-Instruct's FP8 scales exported as a
model folder load in vLLM with kv_cache_dtype = "fp8", and the engine's introspection reads back
every layer's k/v scale equal to the file's; vLLM-CPU's FP8 cache write measured on its own kernel;
the server-log messages evals.provenance.server_log looks for exist verbatim in vLLM's source."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh --vllm makes .venv-vllm)")

import torch

from evals.engines import base as engine_base
from evals.engines import build_engine
from evals.engines.vllm.introspect import E4M3_PROBE, E5M2_PROBE, cpu_fp8_encoding
from evals.engines.vllm.offline import VllmEngine
from evals.models.resolve import resolve_model
from evals.provenance import server_log
from quant.scales.files import KVScales
from tests.evals.engines.vllm.vllm_export import calibrate_export
from tests.vllm_env import skip_unless_cpu_runs_fp8_kv

pytestmark = pytest.mark.vllm

ARGS = {"dtype": "bfloat16", "kv_cache_dtype": "fp8", "max_model_len": 256, "enforce_eager": True,
        "max_num_seqs": 4}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[KVScales, Path]:
    """`qa calibrate --export vllm --model-out` run for real in the main venv: the scales file and the folder."""
    return calibrate_export(tmp_path_factory.mktemp("export"), "fp8_e4m3")


@pytest.fixture(scope="module")
def engine(exported: tuple[KVScales, Path]) -> Iterator[VllmEngine]:
    skip_unless_cpu_runs_fp8_kv()
    built = build_engine("vllm", resolve_model(str(exported[1])), ARGS)
    assert isinstance(built, VllmEngine)
    yield built
    built.close()


def test_exported_scales_load_and_read_back_per_layer(engine: VllmEngine, exported: tuple[KVScales, Path]) -> None:
    scales, _ = exported
    prov = engine.kv_provenance
    assert prov is not None
    assert (prov.source, prov.kv_dtype, prov.storage_dtype) == ("vllm-offline", "fp8", "uint8")
    assert prov.scales_origin == "checkpoint"
    assert [s.layer for s in prov.layers] == list(range(scales.num_layers))
    for layer in prov.layers:  # float32 in the file, the same float32 in the kernel's scale
        assert layer.k_scale == [float(scales.k_scale[layer.layer])]
        assert layer.v_scale == [float(scales.v_scale[layer.layer])]
    assert len({s.k_scale[0] for s in prov.layers}) > 1  # calibrated: not one shared default
    assert engine.info.details["kv_cache_dtype_resolved"] == "fp8"
    [out] = engine.generate([engine_base.GenerateRequest(prompt="The capital of France is", max_tokens=4)])
    assert isinstance(out, engine_base.GenerateResult) and out.output_tokens > 0


@pytest.mark.parametrize(("kv_dtype", "probe", "fmt"), [("fp8", E4M3_PROBE, "e4m3fn"),
                                                        ("fp8_e4m3", E4M3_PROBE, "e4m3fn"),
                                                        ("fp8_e5m2", E5M2_PROBE, "e5m2")])
def test_cpu_fp8_cache_write_measured(kv_dtype: str, probe: tuple[float, int, int], fmt: str) -> None:
    value, nearest, truncated = probe
    # the probe sits between two codes, above their midpoint: torch's round-to-nearest takes the upper one
    torch_dtype = torch.float8_e5m2 if fmt == "e5m2" else torch.float8_e4m3fn
    assert int(torch.tensor(value).to(torch_dtype).view(torch.uint8)) == nearest
    assert float(torch.tensor([truncated], dtype=torch.uint8).view(torch_dtype).float()) < value
    encoding = cpu_fp8_encoding(kv_dtype)
    if encoding is None:
        pytest.skip("vLLM's CPU FP8 cache write is not available on this CPU (needs AVX-512 or AMX)")
    # vLLM-CPU 0.32 truncates (docs/ENGINES.md "KV cache and scales that really ran"); a change must show up here
    assert encoding == f"{fmt} codes, truncated toward zero"


def test_server_log_messages_exist_in_vllm_source() -> None:
    import vllm

    root = Path(vllm.__file__).parent
    sources = {p: p.read_text(encoding="utf-8", errors="replace") for p in (
        root / "config" / "cache.py", root / "config" / "vllm.py",
        root / "model_executor" / "layers" / "quantization" / "kv_cache.py",
        root / "model_executor" / "models" / "utils.py", root / "v1" / "engine" / "core.py")}
    text = "\n".join(sources.values())  # each message is one string literal there
    for message in (server_log.SCALE_DEFAULTED, server_log.NO_Q_SCALE, server_log.FUSED_KV_SCALE,
                    "data type to store kv cache", server_log.ENGINE_CONFIG.strip(), "kv_cache_dtype=",
                    "quantization="):
        assert message in text, message


@pytest.mark.gpu
def test_exported_scales_on_cuda(exported: tuple[KVScales, Path]) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    scales, folder = exported
    gpu = build_engine("vllm", resolve_model(str(folder)), {**ARGS, "gpu_memory_utilization": 0.3})
    try:
        prov = gpu.kv_provenance  # type: ignore[attr-defined]
        assert prov is not None and prov.scales_origin == "checkpoint" and prov.encoding is None
        assert [s.k_scale for s in prov.layers] == [[float(k)] for k in scales.k_scale]
    finally:
        gpu.close()
