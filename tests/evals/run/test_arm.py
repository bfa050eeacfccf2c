"""evals.run.arm: what identifies an arm's configuration (the arm.json it writes), typed arm configs, and resuming
folders written before the manifest and the engine arguments were typed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from evals.engines.hf.args import HFEngineArgs
from evals.engines.openai_api.args import OpenAIArgs
from evals.engines.vllm.args import VllmEngineArgs
from evals.errors import EngineError, EvalError, RecordError
from evals.models.resolve import ResolvedModel
from evals.records.arm_file import ARM_FILE, ArmManifest
from evals.run.arm import ArmConfig, ArmTask, arm_manifest, check_arm_folder, parse_arm
from evals.tasks import get_task
from evals.tasks.base import TaskOptions

MODEL = ResolvedModel(name="tiny", path=Path("/models/tiny"), hub_id=None, file_hash="ab" * 32)
GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "arm_json_v1.json").read_text())


def _scales(folder: Path, value: bytes, meta: str = "{}") -> Path:
    """A stand-in scales pair (the manifest hashes bytes; it does not parse them)."""
    folder.mkdir(parents=True)
    stem = folder / "kv_scales.safetensors"
    stem.write_bytes(value)
    stem.with_suffix(".json").write_text(meta)
    return stem


def _manifest(scales: Path) -> ArmManifest:
    config = ArmConfig(name="candidate", model="tiny",
                       engine_args={"kv": {"format": "nvfp4", "scales": "static"}, "scales": str(scales)})
    return arm_manifest(config, MODEL, [])


def _golden_case(case: dict[str, Any], scales: Path) -> ArmManifest:
    """The manifest the current code makes for one golden case (its scales file recreated at `scales`)."""
    arm = dict(case["arm"])
    if "scales" in arm.get("engine_args", {}):
        arm["engine_args"] = {**arm["engine_args"], "scales": str(scales)}
    built = []
    for t in case["tasks"]:
        options = TaskOptions(**t["options"])
        built.append((get_task(t["name"], options), options, t["limit"], t["repeats"]))
    return arm_manifest(parse_arm(arm), MODEL, built)


@pytest.fixture
def golden_scales(tmp_path: Path) -> Path:
    return _scales(tmp_path / "run" / "calibration", GOLDEN["scales_bytes"].encode(), GOLDEN["scales_json"])


@pytest.mark.parametrize("case", [pytest.param(c, id=c["source"]) for c in GOLDEN["cases"]])
def test_fingerprints_equal_those_the_untyped_code_wrote(case: dict[str, Any], golden_scales: Path) -> None:
    """Every arm of every committed spec (and edge cases), as `qa run` resolved it before the change."""
    assert MODEL.file_hash == GOLDEN["model_file_hash"]
    assert _golden_case(case, golden_scales).to_json() == case["manifest"]


def test_an_arm_json_written_before_the_change_loads_and_resumes(tmp_path: Path, golden_scales: Path) -> None:
    case = next(c for c in GOLDEN["cases"] if c["source"] == "reports/reference/spec.toml:candidate")
    old = {**case["manifest"], "engine_info": {"name": "hf", "deterministic": True}}
    arm_dir = tmp_path / "records" / "candidate"
    arm_dir.mkdir(parents=True)
    text = json.dumps(old, indent=2, sort_keys=True) + "\n"  # how the untyped code wrote it
    (arm_dir / ARM_FILE).write_text(text)
    loaded = ArmManifest.load(arm_dir / ARM_FILE)
    assert loaded.engine_info is not None and loaded.engine_info.deterministic
    merged = check_arm_folder(arm_dir, _golden_case(case, golden_scales))  # resumes
    assert merged.fingerprint == old["fingerprint"] and set(merged.tasks) == set(old["tasks"])
    merged.save(arm_dir / ARM_FILE)
    assert (arm_dir / ARM_FILE).read_text() == text  # written back byte for byte


def test_moved_run_folder_keeps_the_fingerprint(tmp_path: Path) -> None:
    first = _scales(tmp_path / "run" / "calibration", b"scale bytes")
    before = _manifest(first)
    shutil.move(tmp_path / "run", tmp_path / "moved")
    after = _manifest(tmp_path / "moved" / "calibration" / "kv_scales.safetensors")
    assert after.fingerprint == before.fingerprint
    assert after.config.engine_args["scales"] == "kv_scales.safetensors"
    arm_dir = tmp_path / "arm"
    arm_dir.mkdir()
    before.save(arm_dir / ARM_FILE)
    assert check_arm_folder(arm_dir, after).fingerprint == before.fingerprint  # resumes


def test_other_scale_values_are_another_configuration(tmp_path: Path) -> None:
    before = _manifest(_scales(tmp_path / "a", b"scale bytes"))
    after = _manifest(_scales(tmp_path / "b", b"other bytes"))
    assert after.fingerprint != before.fingerprint
    arm_dir = tmp_path / "arm"
    arm_dir.mkdir()
    before.save(arm_dir / ARM_FILE)
    with pytest.raises(RecordError, match="another configuration.*engine_files"):
        check_arm_folder(arm_dir, after)


def test_a_started_servers_url_is_not_part_of_the_arm(tmp_path: Path) -> None:
    def manifest(port: int) -> ArmManifest:
        config = ArmConfig(name="c", model="m", engine="openai", server={"kind": "llamacpp"},
                           engine_args={"base_url": f"http://127.0.0.1:{port}/v1", "concurrency": 2})
        return arm_manifest(config, MODEL, [])

    assert manifest(8000).fingerprint == manifest(8001).fingerprint
    assert manifest(8000).config.engine_args == {"concurrency": 2}


def test_records_without_an_arm_json_are_another_configuration(tmp_path: Path) -> None:
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "gsm8k.jsonl").write_text("")
    with pytest.raises(RecordError, match="holds records .*gsm8k.jsonl.* but no arm.json"):
        check_arm_folder(stray, _manifest(tmp_path / "s" / "kv_scales.safetensors"))


def test_arm_config_parses_engine_args_once_for_its_engine() -> None:
    assert isinstance(ArmConfig(name="a", model="m").engine_args, HFEngineArgs)
    vllm = parse_arm({"name": "a", "model": "m", "engine": "vllm", "engine_args": {"kv_cache_dtype": "fp8"}})
    assert isinstance(vllm.engine_args, VllmEngineArgs) and vllm.engine_args.flags() == {"kv_cache_dtype": "fp8"}
    typed = OpenAIArgs(base_url="http://127.0.0.1:1/v1")
    assert ArmConfig(name="a", model="m", engine="openai", engine_args=typed).engine_args is typed
    with pytest.raises(EvalError, match="engine 'vllm' takes VllmEngineArgs, not OpenAIArgs"):
        parse_arm({"name": "a", "model": "m", "engine": "vllm", "engine_args": typed})
    with pytest.raises(EngineError, match="unknown engine 'vlm'; did you mean 'vllm'"):
        parse_arm({"name": "a", "model": "m", "engine": "vlm"})
    with pytest.raises(EngineError, match="did you mean 'batch_size'"):
        parse_arm({"name": "a", "model": "m", "engine_args": {"batchsize": 2}})


def test_arm_config_rejects_bad_names_and_unknown_keys() -> None:
    with pytest.raises(EvalError, match="arm name"):
        parse_arm({"name": "../x", "model": "m"})
    with pytest.raises(EvalError, match="limits"):
        parse_arm({"name": "a", "model": "m", "limits": 3})
    assert ArmConfig(name="a", model="m").repeats == 1
    assert ArmTask("gsm8k").options.num_fewshot is None
