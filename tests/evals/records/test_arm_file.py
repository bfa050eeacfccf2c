"""evals.records.arm_file: the arm.json contract read back in one line when it is not a manifest this toolkit
resumes, written in the shape it has always had (sorted keys, two-space indent), and a reused arm's source kept
outside the fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.errors import RecordError
from evals.records.arm_file import ARM_FILE, ArmManifest, ReusedFrom

DATA = {"schema_version": 1, "fingerprint": "f" * 64,
        "tasks": {"gsm8k": {"name": "gsm8k", "version": "1", "config": {"num_fewshot": 5}, "fingerprint": "e" * 64}},
        "config": {"name": "baseline", "model": "m", "model_file_hash": None, "engine": "hf", "engine_args": {},
                   "engine_files": {}, "limit": None, "repeats": 1, "seed": 0}}


def test_bad_manifests_are_one_line_record_errors(tmp_path: Path) -> None:
    path = tmp_path / ARM_FILE
    good = ArmManifest.model_validate(DATA).to_json()
    for content, match in [("{not json", "not a valid arm manifest"),
                           (json.dumps({**good, "schema_version": 9}), "manifest schema 9, this toolkit writes 1"),
                           (json.dumps({k: v for k, v in good.items() if k != "fingerprint"}), "fingerprint"),
                           (json.dumps([1, 2]), "not a valid arm manifest")]:
        path.write_text(content)
        with pytest.raises(RecordError, match=match) as info:
            ArmManifest.load(path)
        assert "\n" not in str(info.value)


def test_a_manifest_is_written_in_the_shape_it_always_had(tmp_path: Path) -> None:
    manifest = ArmManifest.model_validate(DATA)
    manifest.save(tmp_path / ARM_FILE)
    assert (tmp_path / ARM_FILE).read_text() == json.dumps(DATA, indent=2, sort_keys=True) + "\n"
    assert ArmManifest.load(tmp_path / ARM_FILE) == manifest


def test_a_reused_arm_records_its_source_outside_the_fingerprint(tmp_path: Path) -> None:
    plain = ArmManifest.model_validate(DATA)
    reused = plain.model_copy(update={"reused_from": ReusedFrom(run_dir="/runs/old", fingerprint="f" * 64)})
    reused.save(tmp_path / ARM_FILE)
    back = ArmManifest.load(tmp_path / ARM_FILE)
    assert back.reused_from == ReusedFrom(run_dir="/runs/old", fingerprint="f" * 64)
    assert back.fingerprint == plain.fingerprint and "reused_from" not in plain.to_json()
