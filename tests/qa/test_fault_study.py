"""scripts/fault_study.py: the committed fault specs are consistent, baseline seeding copies exactly
the spec's tasks and detects a re-run, and the table's extrapolations match hand-computed values."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from qa.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("fault_study", ROOT / "scripts" / "fault_study.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fault_study"] = module
    spec.loader.exec_module(module)
    return module


def test_committed_fault_specs_share_baseline_and_apply_their_presets(study) -> None:
    specs = study.load_fault_specs(study.FAULTS)
    assert set(specs) == set(study.FAULTS)
    first = specs["aa"]
    assert all(
        s.arms["baseline"] == first.arms["baseline"] and s.tasks == first.tasks for s in specs.values()
    )
    kv = specs["scale_10x"].arms["candidate"].engine_args["kv"]
    assert kv == {**study.REFERENCE_KV, "scale_multiplier": 10.0}


def test_a_spec_whose_kv_is_not_its_preset_is_refused(study, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(study, "REFERENCE_KV", {**study.REFERENCE_KV, "recent_window": 64})
    with pytest.raises(SystemExit, match="is not preset 'v_scale_layout' applied"):
        study.load_fault_specs(study.FAULTS)


def test_n_to_fail_and_sigma_extrapolations_hand_computed(study) -> None:
    # z_0.95 = 1.6449: (1.6449 * 0.1 / (0.05 - 0.02))^2 = 30.06 -> 31 items
    assert study._n_to_fail({"delta": -0.05, "sd_diff": 0.1}, margin=0.02, alpha=0.05) == "31"
    assert study._n_to_fail({"delta": -0.01, "sd_diff": 0.1}, margin=0.02, alpha=0.05).startswith("never")
    # 50 * (1.5 * 0.004 / 0.007)^2 = 36.7 -> 37 items
    assert study._n_sigma_fails({"delta": -0.007, "se_baseline": 0.004, "n": 50}, k=1.5) == "37"


TINY = """
name = "seed-test"
[arms.baseline]
engine = "hf"
engine_args = { batch_size = 4 }
[arms.candidate]
engine = "hf"
engine_args = { batch_size = 2 }
[[tasks]]
name = "wikitext_kl"
limit = 3
"""


def test_seed_arm_copies_only_the_spec_tasks_and_detects_a_rerun(study, tmp_path: Path) -> None:
    source = tmp_path / "source" / "records" / "baseline"
    source.mkdir(parents=True)
    manifest = {
        "schema_version": 1,
        "config": {},
        "fingerprint": "f",
        "tasks": {"wikitext_kl": {"fingerprint": "w"}, "arc_challenge": {"fingerprint": "a"}},
    }
    (source / "arm.json").write_text(json.dumps(manifest))
    (source / "wikitext_kl.jsonl").write_text('{"x": 1}\n')
    (source / "arc_challenge.jsonl").write_text('{"x": 2}\n')
    run_dir = tmp_path / "run"
    seeded = study.seed_arm(parse_spec(TINY), run_dir, tmp_path / "source", calibration=False)
    arm = run_dir / "records" / "baseline"
    assert set(seeded) == {"wikitext_kl.jsonl"} and not (arm / "arc_challenge.jsonl").exists()
    assert set(json.loads((arm / "arm.json").read_text())["tasks"]) == {"wikitext_kl"}
    assert (run_dir / "spec.toml").exists()
    assert study.check_unchanged(run_dir, "baseline", seeded)
    (arm / "wikitext_kl.jsonl").write_text('{"x": 1}\n{"x": 3}\n')  # an arm that re-ran appends
    assert not study.check_unchanged(run_dir, "baseline", seeded)
