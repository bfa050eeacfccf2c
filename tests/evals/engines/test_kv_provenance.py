"""KV-scale provenance: the emulator's per-layer decode scales from a real scales file, vLLM's origin
rules on worker readouts, the dispatch per engine, and what run_arm writes into arm.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from evals.engines.hf.args import parse_args
from evals.engines.kv_provenance import emulator_provenance, engine_provenance
from evals.engines.openai_api.args import parse_openai_args
from evals.engines.vllm.introspect import provenance_from_worker, scales_origin
from evals.provenance.record import KVProvenance
from evals.provenance.server_log import server_log_path
from evals.records.arm_file import ARM_FILE, EngineSummary
from evals.run.arm import parse_arm, run_arm
from qa.gate.provenance import check_scales
from qa.pipeline.calibration import calibrate_model
from quant.fileio import sha256_file
from quant.kv.calibrate import CalibrationSpec
from quant.scales.export import export_model_folder
from quant.scales.files import CalibrationData, KVScales, ScalesMeta
from quant.scales.folder import read_folder_scales
from tests.evals.hf_fixtures import save_tiny
from tests.evals.provenance.test_server_log import CONFIG_LINE
from tests.evals.run.test_runner import EchoTask
from tests.quant.ckpt_folders import k_scale_folder
from tests.tiny_models import CORPUS


def _scales_file(tmp_path: Path) -> Path:
    k_amax = torch.tensor([[4.48, 8.96], [1.0, 2.0]])  # [L=2, H=2]
    v_amax = torch.tensor([[0.448, 0.896], [3.0, 6.0]])
    meta = ScalesMeta(format="fp8_e4m3", convention="decode", observer="absmax", granularity="head", num_layers=2,
                      num_kv_heads=2, model="m", data=CalibrationData(name="d", sha256="0", n_samples=1, seq_len=8),
                      seed=0)
    scales = KVScales(k_amax=k_amax, v_amax=v_amax, k_scale=k_amax / 448, v_scale=v_amax / 448, meta=meta)
    stem = tmp_path / "kv_scales"
    scales.save(stem)
    return stem


def test_emulator_static_scales_are_the_decode_scales_of_each_layers_format(tmp_path: Path) -> None:
    stem = _scales_file(tmp_path)
    args = parse_args({"kv": {"format": "nvfp4", "scales": "static", "layer_formats": {1: "fp8_e4m3"}},
                       "scales": str(stem)})
    prov = emulator_provenance(args)
    assert (prov.source, prov.kv_dtype, prov.scales_origin, prov.scales_expected) == (
        "hf-emulator", "nvfp4", "calibrated", True)
    assert prov.scales_sha256 == sha256_file(stem.with_name("kv_scales.safetensors"))
    layer0, layer1 = prov.layers
    assert layer0.format == "nvfp4" and layer1.format == "fp8_e4m3"
    # NVFP4 decode scale: amax / (448 * 6); FP8 E4M3: amax / 448 (per head, as calibrated)
    assert layer0.k_scale == pytest.approx([4.48 / 2688, 8.96 / 2688], rel=1e-6)
    assert layer1.v_scale == pytest.approx([3.0 / 448, 6.0 / 448], rel=1e-6)


def test_emulator_other_scale_modes() -> None:
    assert emulator_provenance(parse_args({})).scales_origin == "unquantized"
    dynamic = emulator_provenance(parse_args({"kv": {"format": "nvfp4"}}))
    assert dynamic.scales_origin == "dynamic" and not dynamic.scales_expected
    const = emulator_provenance(parse_args({"kv": {"format": "fp8_e4m3", "scales": "constant", "constant_scale": 1.0}}))
    assert (const.scales_origin, const.constant_scale) == ("constant", 1.0)
    assert "scales constant 1" in const.summary()


def _worker(cache_dtype: str, scales: list[float], method: str | None) -> dict[str, object]:
    layers = [{"name": f"model.layers.{i}.self_attn.attn", "kv_cache_dtype": cache_dtype, "k_scale": s,
               "v_scale": s if s == 1.0 else s / 2, "quant_method": method} for i, s in enumerate(scales)]
    return {"cache_dtype": cache_dtype, "storage_dtypes": ["uint8"], "layers": layers}


def test_vllm_origin_follows_its_loading_rules() -> None:
    assert scales_origin("auto", _worker("auto", [1.0], None)["layers"]) == "unquantized"  # type: ignore[arg-type]
    plain = provenance_from_worker(_worker("fp8", [1.0, 1.0], None))  # no quant config: never loaded
    assert (plain.scales_origin, plain.scales_expected) == ("defaulted", False)
    ckpt = provenance_from_worker(_worker("fp8", [0.02, 0.03], "CompressedTensorsKVCacheMethod"), "enc")
    assert (ckpt.scales_origin, ckpt.scales_expected, ckpt.encoding) == ("checkpoint", True, "enc")
    assert [s.k_scale for s in ckpt.layers] == [[0.02], [0.03]] and ckpt.layers[1].v_scale == [0.015]
    missing = provenance_from_worker(_worker("fp8", [1.0, 1.0], "CompressedTensorsKVCacheMethod"))
    assert (missing.scales_origin, missing.scales_expected) == ("defaulted", True)  # placeholders kept: 1.0


def test_engine_provenance_dispatch_and_manifest_round_trip(tmp_path: Path) -> None:
    log = server_log_path(tmp_path, "cand")
    assert log == tmp_path / "logs" / "cand-server.log"
    log.parent.mkdir()
    log.write_text(CONFIG_LINE.format(q="None", kv="fp8"))
    openai_args = parse_openai_args({"base_url": "http://127.0.0.1:1/v1"})
    from_log = engine_provenance(object(), openai_args, log)
    assert from_log is not None and from_log.scales_origin == "defaulted"
    assert engine_provenance(object(), openai_args, None) is None  # a remote server: nothing to read
    own = KVProvenance(source="vllm-offline", kv_dtype="fp8", scales_origin="checkpoint")

    class Engine:
        kv_provenance = own

    assert engine_provenance(Engine(), openai_args, log) is own
    summary = EngineSummary(name="vllm", deterministic=False, kv=own)
    assert EngineSummary.model_validate_json(summary.model_dump_json()) == summary


def test_run_arm_records_the_emulators_provenance_in_arm_json(tmp_path: Path) -> None:
    model_dir = save_tiny(tmp_path / "tiny")
    text = tmp_path / "calib.txt"
    text.write_text(CORPUS * 10, encoding="utf-8")
    scales = calibrate_model(str(model_dir), str(text), CalibrationSpec(format="nvfp4", n_samples=2, seq_len=32))
    stem = tmp_path / "kv_scales"
    scales.save(stem)
    config = parse_arm({"name": "cand", "model": str(model_dir), "limit": 2,
                        "engine_args": {"batch_size": 2, "kv": {"format": "nvfp4", "scales": "static"},
                                        "scales": str(stem)}})
    run_arm(config, [EchoTask(n_items=2)], tmp_path / "run", progress=False)
    kv = json.loads((tmp_path / "run" / "records" / "cand" / ARM_FILE).read_text())["engine_info"]["kv"]
    assert kv["scales_origin"] == "calibrated" and kv["scales_expected"] is True
    assert kv["scales_sha256"] == sha256_file(stem.with_name("kv_scales.safetensors"))
    assert len(kv["layers"]) == scales.num_layers == 2
    for layer, k, v in zip(kv["layers"], scales.k_amax, scales.v_amax, strict=True):  # NVFP4: amax / (448 * 6)
        assert layer["format"] == "nvfp4"
        assert layer["k_scale"] == pytest.approx([float(k) / 2688], rel=1e-6)
        assert layer["v_scale"] == pytest.approx([float(v) / 2688], rel=1e-6)


def test_scales_from_a_folder_are_recorded_with_their_convention_and_a_mismatch_is_found(tmp_path: Path) -> None:
    """kv = { format, scales = "DIR" }: arm.json names the folder's scales by their files' sha256, the
    convention the cache read them in and how the folder was read (declared, fitted when `qa run` fitted it);
    an NVFP4 cache fed an FP8 folder reads it converted (no mismatch), while a vLLM fp8 cache fed our NVFP4
    folder reads it as it is and shows as a mismatch (qa.gate.provenance fails it under require_scales)."""
    model_dir = save_tiny(tmp_path / "tiny")
    text = tmp_path / "calib.txt"
    text.write_text(CORPUS * 10, encoding="utf-8")
    scales = calibrate_model(str(model_dir), str(text), CalibrationSpec(format="nvfp4", n_samples=2, seq_len=32))
    ours = tmp_path / "ours"
    export_model_folder(scales, model_dir, ours)
    config = parse_arm({"name": "cand", "model": str(model_dir), "limit": 2,
                        "engine_args": {"batch_size": 2, "kv": {"format": "nvfp4", "scales": str(ours)}}})
    run_arm(config, [EchoTask(n_items=2)], tmp_path / "run", progress=False)
    manifest = json.loads((tmp_path / "run" / "records" / "cand" / ARM_FILE).read_text())
    kv = KVProvenance.model_validate(manifest["engine_info"]["kv"])
    assert (kv.scales_origin, kv.scales_convention) == ("calibrated", "nvfp4-decode")
    assert kv.scales_sha256 == read_folder_scales(ours).sha256()
    assert any(key.endswith(":kv_scales.safetensors") for key in manifest["config"]["engine_files"])
    for layer, k in zip(kv.layers, scales.k_scale, strict=True):  # the calibrated float32, to the bit
        assert layer.k_scale == [float(k)]
    assert check_scales("cand", kv).finding == "ok"

    fp8 = k_scale_folder(tmp_path / "fp8", [0.02, 0.03], [0.01, 0.04], num_bits=8)
    crossed = emulator_provenance(parse_args({"kv": {"format": "nvfp4", "scales": str(fp8)}}))
    assert crossed.scales_convention == "nvfp4-decode" and check_scales("c", crossed).finding == "ok"
    assert crossed.folder_scales is not None and crossed.folder_scales.declared == "fp8-decode"
    assert (crossed.folder_scales.read_as, crossed.folder_scales.fit_on) == ("nvfp4-decode", None)
    assert [s.k_scale for s in crossed.layers] == [pytest.approx([0.02 * 448 / 2688], rel=1e-6),
                                                  pytest.approx([0.03 * 448 / 2688], rel=1e-6)]
    assert "(declared fp8-decode, not fitted)" in crossed.summary()

    class Engine:  # a vLLM engine on our NVFP4 folder, run with kv_cache_dtype fp8
        kv_provenance = KVProvenance(source="vllm-offline", kv_dtype="fp8", scales_origin="checkpoint",
                                     scales_expected=True)
        info = type("Info", (), {"model": str(ours)})()

    annotated = engine_provenance(Engine(), None, None)
    assert annotated is not None and annotated.scales_convention == "nvfp4-decode"
    assert check_scales("c", annotated).finding == "mismatch"
