"""resolved.json names no machine path: absolute paths are written relative to the run directory
("{run}/..."), read back absolute against it, and every committed run folder's resolved.json has none."""

from __future__ import annotations

import json
from pathlib import Path

from qa.files.resolved_json import RUN_MARK, ResolvedRecord, load_resolved, save_resolved

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "reports" / "main_job" / "resolved.json"


def _with_paths(run: Path) -> ResolvedRecord:
    """The committed main job's record with the absolute paths a fresh run in `run` would hold."""
    data = json.loads(COMMITTED.read_text(encoding="utf-8"))
    data["data_dir"] = "/data/benchmarks"
    data["policy"]["path"] = str(run.parent / "policies" / "p.toml")
    for arm in data["arms"]:
        arm["python"] = "/opt/venv/bin/python"
        if arm["kind"] == "candidate":
            arm["engine_args"]["scales"] = str(run / "calibration" / "kv_scales.safetensors")
    return ResolvedRecord.model_validate(data)


def test_absolute_paths_are_written_relative_to_the_run_folder_and_read_back_exactly(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    record = _with_paths(run)
    save_resolved(run / "resolved.json", record)
    text = (run / "resolved.json").read_text(encoding="utf-8")
    assert '"/' not in text  # no absolute path: one outside the run folder is reached through ".."
    data = json.loads(text)
    assert data["policy"]["path"] == RUN_MARK + "../policies/p.toml"
    cand = next(a for a in data["arms"] if a["kind"] == "candidate")
    assert cand["engine_args"]["scales"] == RUN_MARK + "calibration/kv_scales.safetensors"
    assert cand["records"] == "records/candidate"  # a path inside the run folder stays as written
    assert load_resolved(run / "resolved.json") == record


def test_no_committed_run_folder_names_a_machine_path() -> None:
    found = sorted((ROOT / "reports").rglob("resolved.json"))
    assert found
    leaks = [str(f.relative_to(ROOT)) for f in found if '"/' in f.read_text(encoding="utf-8")]
    assert leaks == []
