"""[calibration] feeds vllm candidates through a model folder: which arms it feeds, and the folder
`qa.run.arm_inputs.arm_config` hands such an arm (exported once from the run's scales file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qa.run.arm_inputs import arm_config
from qa.run.calibration import calibrate_model, feeds_vllm
from qa.files.rundir import RunDir
from qa.files.spec import parse_spec
from quant.calibrate import CalibrationSpec
from quant.export import SCALES_FILE
from tests.evals.hf_fixtures import save_tiny
from tests.tiny_models import CORPUS

SPEC = """
name = "vllm-fed"
model = "{model}"

[calibration]
format = "{fmt}"
n_samples = 2
seq_len = 32

[arms.baseline]
engine = "vllm"
engine_args = {{ kv_cache_dtype = "auto" }}

[arms.candidate]
engine = "vllm"
engine_args = {{ kv_cache_dtype = "fp8" }}

[arms.e5m2]
engine = "vllm"
engine_args = {{ kv_cache_dtype = "fp8_e5m2" }}

[[tasks]]
name = "arc_easy"
limit = 2
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


def test_which_arms_are_fed(tiny: Path) -> None:
    spec = parse_spec(SPEC.format(model=tiny, fmt="fp8_e4m3"))
    assert [r for r in spec.arms if feeds_vllm(spec, r)] == ["candidate"]  # not the baseline, not e5m2
    assert not feeds_vllm(parse_spec(SPEC.format(model=tiny, fmt="nvfp4")), "candidate")


def test_fed_arm_serves_the_exported_folder(tiny: Path, tmp_path: Path) -> None:
    spec = parse_spec(SPEC.format(model=tiny, fmt="fp8_e4m3"))
    rd = RunDir(tmp_path / "run")
    text = tmp_path / "calib.txt"
    text.write_text(CORPUS * 20, encoding="utf-8")
    scales = calibrate_model(str(tiny), str(text), CalibrationSpec(format="fp8_e4m3", n_samples=2, seq_len=32))
    scales.save(rd.scales)
    config = arm_config(spec, "candidate", rd, None)
    assert config.model == str(rd.vllm_model)
    written = json.loads((rd.vllm_model / "config.json").read_text())
    assert written["quantization_config"]["kv_cache_scheme"]["num_bits"] == 8
    assert (rd.vllm_model / SCALES_FILE).is_file()
    again = arm_config(spec, "candidate", rd, None)  # the folder is reused, not rewritten
    assert again.model == config.model
    assert arm_config(spec, "baseline", rd, None).model == str(tiny)
