"""Data file hashes (env.json) and the manifest check behind `qa data verify`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evals.data import integrity
from evals.errors import DataError
from evals.tasks import task_datasets
from tests.shared_data import SHARED_DATA as DATA_DIR

needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data")


@needs_data
def test_file_hashes_match_manifest_json() -> None:
    manifest = json.loads((DATA_DIR / "manifest.json").read_text(encoding="utf-8"))
    expected = {f["file"]: f["sha256"] for ds in manifest["datasets"] for f in ds.get("files", [])}
    hashes = integrity.data_file_hashes(["gsm8k", "piqa", "gpqa_main"], DATA_DIR)
    assert set(hashes) == {
        "gsm8k/test.jsonl",
        "gsm8k/train.jsonl",
        "piqa/valid.jsonl",
        "piqa/valid-labels.lst",
        "gpqa/dataset.zip",
    }
    assert all(hashes[k] == expected[k] for k in hashes)
    assert integrity.manifest_hashes(DATA_DIR) == expected
    assert integrity.data_file_hashes(["gsm8k"], None) == {}
    # a run's task names map to their datasets first (the pipeline passes task_datasets of its tasks)
    by_task = integrity.data_file_hashes(
        task_datasets(["gpqa_main_cot_zeroshot", "truthfulqa_mc2", "gpqa_main_zeroshot"]), DATA_DIR
    )
    assert set(by_task) == {"gpqa/dataset.zip", "truthfulqa/data/v1/mc_task.json"}
    with pytest.raises(DataError, match="did you mean"):
        integrity.data_file_hashes(["gsm8k_cot"], DATA_DIR)


@needs_data
def test_verify_reports_each_split_and_file(tmp_path: Path) -> None:
    assert all(c.ok for c in integrity.verify(DATA_DIR, ["math500"]))
    (tmp_path / "math500").mkdir()
    shutil.copy(DATA_DIR / "manifest.json", tmp_path / "manifest.json")
    lines = (DATA_DIR / "math500/test.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "math500/test.jsonl").write_text("".join(lines[:499]), encoding="utf-8")
    split, file = integrity.verify(tmp_path, ["math500"])
    assert (split.subject, split.ok) == ("split test", False) and "499 items, expected 500" in split.detail
    assert (file.subject, file.ok) == ("math500/test.jsonl", False) and "differs from manifest.json" in file.detail
    (tmp_path / "manifest.json").unlink()
    assert integrity.verify(tmp_path, ["math500"])[1].detail == "present (no manifest.json entry to compare)"


def test_missing_files_and_a_bad_manifest(tmp_path: Path) -> None:
    checks = integrity.verify(tmp_path, ["piqa"])
    assert [c.ok for c in checks] == [False, False, False]
    assert [c.detail for c in checks[1:]] == ["missing", "missing"]
    (tmp_path / "manifest.json").write_text('{"datasets": 3}', encoding="utf-8")
    with pytest.raises(DataError, match="manifest.json: expected"):
        integrity.manifest_hashes(tmp_path)
    with pytest.raises(DataError, match="missing"):
        integrity.data_file_hashes(["piqa"], tmp_path)
