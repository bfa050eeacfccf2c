"""`qa calibrate` and `qa kv-inspect` end to end on a tiny random Llama folder and a text file:
files written and readable, the decode convention held, JSON and PNG outputs, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from quant.scales.export import SCALES_FILE
from quant.scales.files import KVScales
from tests.evals.hf_fixtures import save_tiny
from tests.qa.cli.test_compare_cmd import run_cli
from tests.tiny_models import CORPUS


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "calib.txt"
    path.write_text(CORPUS * 20, encoding="utf-8")
    return path


def test_calibrate_writes_scales_and_vllm_export(tiny_folder: Path, text_file: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "scales" / "tiny"
    rc, stdout, err = run_cli(["calibrate", "--model", str(tiny_folder), "--data", str(text_file),
                               "--n-samples", "3", "--seq-len", "32", "--observer", "absmax",
                               "--out", str(out), "--export", "vllm"], capsys)
    assert rc == 0, err
    scales = KVScales.load(out)
    assert scales.num_layers == 2 and scales.meta.observer == "absmax"
    assert scales.meta.data.name == "calib.txt" and scales.meta.data.n_samples == 3
    # NVFP4 decode convention, checked independently of the module: d = amax / (448 * 6)
    torch.testing.assert_close(scales.k_scale, scales.k_amax / 2688.0, rtol=1e-6, atol=0)
    torch.testing.assert_close(scales.v_scale, scales.v_amax / 2688.0, rtol=1e-6, atol=0)
    assert bool((scales.k_amax > 0).all()) and bool((scales.v_amax > 0).all())
    assert f"wrote {out.parent / SCALES_FILE}" in stdout  # export folder defaults to OUT's folder
    tensors = load_file(str(out.parent / SCALES_FILE))
    assert float(tensors["model.layers.1.self_attn.v_scale"]) == pytest.approx(float(scales.v_scale[1]), rel=1e-7)


def test_calibrate_bad_observer_is_one_line(tiny_folder: Path, text_file: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(["calibrate", "--model", str(tiny_folder), "--data", str(text_file),
                          "--observer", "median", "--out", str(tmp_path / "s")], capsys)
    assert rc == 2
    assert err.startswith("error: calibrate: --observer") and err.count("\n") == 1
    assert not (tmp_path / "s.safetensors").exists()


def test_kv_inspect_json_and_plot(tiny_folder: Path, text_file: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "sqnr.png"
    rc, stdout, err = run_cli(["kv-inspect", "--model", str(tiny_folder), "--data", str(text_file),
                               "--n-prompts", "2", "--seq-len", "32", "--json", "--plot", str(plot)], capsys)
    assert rc == 0, err
    report = json.loads(stdout)
    assert [layer["layer"] for layer in report["layers"]] == [0, 1]
    for layer in report["layers"]:
        for kind in ("k", "v"):
            # NVFP4 of Gaussian-like values: SQNR in the tens of dB, never exact, never noise
            assert 5.0 < layer[kind]["sqnr_db"] < 40.0
            assert 0.0 <= layer[kind]["saturation_share"] <= 1.0
        assert 0.0 < layer["attn_rel_error"] < 1.0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_kv_inspect_missing_scales_is_one_line(tiny_folder: Path, text_file: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(["kv-inspect", "--model", str(tiny_folder), "--data", str(text_file),
                          "--scales", str(tmp_path / "nope")], capsys)
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1


def test_calibrate_model_out_writes_a_vllm_model_folder(tiny_folder: Path, text_file: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out, folder = tmp_path / "scales" / "tiny", tmp_path / "tiny-fp8kv"
    rc, stdout, err = run_cli(["calibrate", "--model", str(tiny_folder), "--data", str(text_file), "--format",
                               "fp8_e4m3", "--n-samples", "2", "--seq-len", "32", "--out", str(out),
                               "--export", "vllm", "--model-out", str(folder)], capsys)
    assert rc == 0, err
    scales = KVScales.load(out)
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization_config"]["kv_cache_scheme"]["strategy"] == "tensor"
    assert f"wrote {folder / SCALES_FILE}" in stdout
    tensors = load_file(str(folder / SCALES_FILE))
    for i in range(scales.num_layers):
        assert float(tensors[f"model.layers.{i}.self_attn.k_scale"]) == float(scales.k_scale[i])
        assert float(tensors[f"model.layers.{i}.self_attn.v_scale"]) == float(scales.v_scale[i])
    weights = sorted(p.name for p in tiny_folder.glob("*.safetensors"))
    for name in weights:  # the weights are the model's own bytes
        assert (folder / name).read_bytes() == (tiny_folder / name).read_bytes()


@pytest.mark.parametrize(("extra", "message"), [
    (["--format", "qa_mxfp4", "--export", "vllm"],
     "error: --model-out: a vLLM model folder takes fp8_e4m3, nvfp4, nvfp4_4over6 scales, not 'qa_mxfp4'"),
    (["--format", "fp8_e4m3"], "error: --model-out writes a vLLM model folder: add --export vllm"),
    (["--format", "int4"],  # refused before the model loads
     "error: KV format 'int4' is now called 'qa_int4' (the toolkit's own format, not vLLM's int4_per_token_head)"),
])
def test_calibrate_model_out_usage_errors(tiny_folder: Path, text_file: Path, tmp_path: Path, extra: list[str],
                                          message: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(["calibrate", "--model", str(tiny_folder), "--data", str(text_file), "--out",
                          str(tmp_path / "s"), "--model-out", str(tmp_path / "m"), *extra], capsys)
    assert rc == 2 and err.startswith(message) and err.count("\n") == 1
    assert not (tmp_path / "m").exists() and not (tmp_path / "s.safetensors").exists()
