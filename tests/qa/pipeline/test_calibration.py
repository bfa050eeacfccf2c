"""[calibration] feeds vllm candidates through a model folder: which arms it feeds (qa.pipeline.resolve), the
folder such an arm serves, and the calibration step of the worker that writes it once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.errors import DataError
from qa.files.spec import parse_spec
from qa.pipeline.calibration import calibration_texts
from qa.pipeline.resolve import feeds_vllm, resolve_run
from qa.pipeline.worker import calibrate_step
from quant.scales.export import SCALES_FILE
from tests.evals.hf_fixtures import save_tiny
from tests.shared_data import shared_data_dir
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
    text = tmp_path / "calib.txt"
    text.write_text(CORPUS * 20, encoding="utf-8")
    spec = parse_spec(SPEC.format(model=tiny, fmt="fp8_e4m3").replace("[calibration]", f"[calibration]\ndataset = '{text}'"))
    run = resolve_run(spec, tmp_path / "run", data_dir=shared_data_dir("arc_easy"), spec_dir=None)
    rd = run.rd
    assert run.config(run.arm("candidate")).model == str(rd.vllm_model)
    assert run.config(run.arm("baseline")).model == str(tiny)
    assert run.record.calibration is not None and run.record.calibration.vllm_model == "calibration/vllm-model"
    calibrate_step(run.record, rd)  # the worker's step: the scales, then the folder they feed
    written = json.loads((rd.vllm_model / "config.json").read_text())
    assert written["quantization_config"]["kv_cache_scheme"]["num_bits"] == 8
    assert (rd.vllm_model / SCALES_FILE).is_file()
    stamp = (rd.vllm_model / "config.json").stat().st_mtime_ns
    calibrate_step(run.record, rd)  # both there: the folder is reused, not rewritten
    assert (rd.vllm_model / "config.json").stat().st_mtime_ns == stamp


def test_a_jsonl_calibration_file_gives_its_texts_and_names_a_bad_line(tmp_path: Path) -> None:
    good = tmp_path / "calib.jsonl"
    good.write_text('{"text": "one"}\n\n{"text": "two", "id": 2}\n', encoding="utf-8")
    assert calibration_texts(str(good), None) == ("calib.jsonl", ["one", "two"])
    for body, line in (('{"text": "one"}\n{"text": \n', 2), ('{"text": 3}\n', 1), ('["text"]\n', 1)):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(body, encoding="utf-8")
        with pytest.raises(DataError, match=rf"bad\.jsonl:{line}: .*expected a JSON object with a string field 'text'"):
            calibration_texts(str(bad), None)
