"""`qa calibrate --format nvfp4 --export vllm --model-out DIR` and `qa kv-inspect --model DIR` on folders
with K/V scales: ours, a hand-built tensor-group encode folder, an amax/6 4-bit per-tensor one, an uncalibrated 1.0 one;
the convention each fits against amax observed on the same prompts, and one-line warnings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from qa.pipeline.calibration import calibrate_model
from quant.kv.calibrate import CalibrationSpec
from quant.scales.export import SCALES_FILE
from quant.scales.files import KVScales
from quant.scales.folder import CONVENTION_FILE
from tests.evals.hf_fixtures import save_tiny
from tests.qa.cli.test_compare_cmd import run_cli
from tests.quant.ckpt_folders import k_scale_folder, tensor_group_encode_folder
from tests.tiny_models import CORPUS

INSPECT = ["--n-prompts", "2", "--seq-len", "32"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "calib.txt"
    path.write_text(CORPUS * 20, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def amax(tiny: Path, text: Path) -> KVScales:
    """What another tool's observers saw: absmax per layer on the same text (other chunks)."""
    return calibrate_model(str(tiny), str(text), CalibrationSpec(format="nvfp4", n_samples=3, seq_len=32, seed=7))


def _inspect(folder: Path, text: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict, list[str]]:
    rc, out, err = run_cli(["kv-inspect", "--model", str(folder), "--data", str(text), *INSPECT, "--json"], capsys)
    assert rc == 0, err
    return json.loads(out)["scales_check"], [line for line in err.splitlines() if line.startswith("warning: ")]


def test_calibrate_writes_an_nvfp4_folder_and_kv_inspect_finds_its_convention(
        tiny: Path, text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, folder = tmp_path / "scales", tmp_path / "tiny-nvfp4kv"
    rc, stdout, err = run_cli(["calibrate", "--model", str(tiny), "--data", str(text), "--format", "nvfp4",
                               "--n-samples", "3", "--seq-len", "32", "--out", str(out), "--export", "vllm",
                               "--model-out", str(folder)], capsys)
    assert rc == 0, err
    assert f"{folder}: k/v_scale in convention nvfp4-decode (amax / 2688); serve it with --kv-cache-dtype nvfp4" \
        in stdout
    scales = KVScales.load(out)
    tensors = load_file(str(folder / SCALES_FILE))
    for i in range(scales.num_layers):  # NVFP4's decode multiplier, float32, as calibrated
        assert float(tensors[f"model.layers.{i}.self_attn.k_scale"]) == float(scales.k_scale[i])
    assert (folder / "tokenizer.json").samefile(tiny / "tokenizer.json")
    record = json.loads((folder / CONVENTION_FILE).read_text())
    assert record["convention"] == "nvfp4-decode" and record["vllm"]["kv_cache_dtype"] == "nvfp4"

    check, warnings = _inspect(folder, text, capsys)
    assert (check["declared"], check["declared_by"], check["fit"], check["expected"]) == (
        "nvfp4-decode", CONVENTION_FILE, "nvfp4-decode", "nvfp4-decode")
    assert 0.5 < check["fit_ratio"] < 2.0 and check["vllm_loads"] is True
    assert warnings == []
    rc, table, err = run_cli(["kv-inspect", "--model", str(folder), "--data", str(text), *INSPECT], capsys)
    assert rc == 0, err
    assert "declared nvfp4-decode (kv_scales_convention.json); fit nvfp4-decode" in table and "K amax here" in table


def test_kv_inspect_on_a_tensor_group_encode_folder(amax: KVScales, text: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    folder = tensor_group_encode_folder(tmp_path / "lc", amax.k_amax.tolist(), amax.v_amax.tolist())
    check, warnings = _inspect(folder, text, capsys)
    assert check["fields"] == ["model.layers.{i}.self_attn.k_global_scale", "model.layers.{i}.self_attn.v_global_scale"]
    assert (check["declared"], check["fit"]) == ("nvfp4-encode", "nvfp4-encode")
    assert 0.5 < check["fit_ratio"] < 2.0
    assert len(warnings) == 1 and "vLLM 0.32 would not load these scales" in warnings[0]
    assert "refuses a kv_cache_scheme of num_bits=4" in warnings[0]


def test_kv_inspect_warns_on_a_global_scale_and_on_scales_of_one(amax: KVScales, text: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # llm-compressor's 4-bit float per-tensor scheme stores amax / 6 (compressed-tensors calculate_qparams):
    # declared and fitted agree, but vLLM would read the number as an NVFP4 decode scale (amax / 2688)
    glob = k_scale_folder(tmp_path / "glob", (amax.k_amax / 6).tolist(), (amax.v_amax / 6).tolist(), num_bits=4)
    check, warnings = _inspect(glob, text, capsys)
    assert (check["declared"], check["fit"]) == ("nvfp4-global", "nvfp4-global")
    assert any("off by the factor 448 between conventions (too large)" in w for w in warnings)
    ones = k_scale_folder(tmp_path / "ones", [1.0, 1.0], [1.0, 1.0], num_bits=8)
    _, warnings = _inspect(ones, text, capsys)
    assert warnings[0] == f"warning: {ones}: every K/V scale is 1.0: uncalibrated (vLLM's default), not measured on data"
    assert len(warnings) == 1
