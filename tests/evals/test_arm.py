"""evals.arm manifests: what identifies an arm's configuration."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evals.arm import ArmConfig, arm_manifest, check_arm_folder
from evals.errors import RecordError
from evals.models import ResolvedModel

MODEL = ResolvedModel(name="tiny", path=Path("/models/tiny"), hub_id=None, file_hash="ab" * 32)


def _scales(folder: Path, value: bytes) -> Path:
    """A stand-in scales pair (the manifest hashes bytes; it does not parse them)."""
    folder.mkdir(parents=True)
    stem = folder / "kv_scales.safetensors"
    stem.write_bytes(value)
    stem.with_suffix(".json").write_text("{}")
    return stem


def _manifest(scales: Path) -> dict:
    config = ArmConfig(name="candidate", model="tiny", engine_args={"kv": {"format": "nvfp4"}, "scales": str(scales)})
    return arm_manifest(config, MODEL, [])


def test_moved_run_folder_keeps_the_fingerprint(tmp_path: Path) -> None:
    first = _scales(tmp_path / "run" / "calibration", b"scale bytes")
    before = _manifest(first)
    shutil.move(tmp_path / "run", tmp_path / "moved")
    after = _manifest(tmp_path / "moved" / "calibration" / "kv_scales.safetensors")
    assert after["fingerprint"] == before["fingerprint"]
    assert after["config"]["engine_args"]["scales"] == "kv_scales.safetensors"
    arm_dir = tmp_path / "arm"
    arm_dir.mkdir()
    (arm_dir / "arm.json").write_text(json.dumps(before))
    assert check_arm_folder(arm_dir, after)["fingerprint"] == before["fingerprint"]  # resumes


def test_other_scale_values_are_another_configuration(tmp_path: Path) -> None:
    before = _manifest(_scales(tmp_path / "a", b"scale bytes"))
    after = _manifest(_scales(tmp_path / "b", b"other bytes"))
    assert after["fingerprint"] != before["fingerprint"]
    arm_dir = tmp_path / "arm"
    arm_dir.mkdir()
    (arm_dir / "arm.json").write_text(json.dumps(before))
    with pytest.raises(RecordError, match="another configuration"):
        check_arm_folder(arm_dir, after)
