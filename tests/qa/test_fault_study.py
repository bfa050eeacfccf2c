"""scripts/fault_study.py and its modules: the committed fault specs are consistent, baseline seeding
copies exactly the spec's tasks and detects a re-run, the tables take every decision from the gate
(extrapolations hand-computed) and rebuild the committed TABLE.md / SUMMARY.md from the folders alone."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from scipy import stats

from evals.records.arm_file import ArmIdentity, ArmManifest, TaskEntry
from qa.api import gate
from qa.files.policy import TaskPolicy, parse_policy
from qa.files.spec import dump_spec, load_spec, parse_spec
from scripts import fault_study, study_runs, study_tables
from scripts.study_published import RunInfo, load_published, publish
from tests.qa.gate_fixtures import estimate_from_scores, make_run_dir

ROOT = Path(__file__).resolve().parents[2]


def test_committed_fault_specs_share_baseline_and_apply_their_presets() -> None:
    specs = study_runs.load_fault_specs(study_runs.FAULTS)
    assert set(specs) == set(study_runs.FAULTS)
    first = specs["aa"]
    assert all(s.arms["baseline"] == first.arms["baseline"] and s.tasks == first.tasks for s in specs.values())
    kv = specs["scale_10x"].arms["candidate"].given_args()["kv"]
    assert kv == {**study_runs.REFERENCE_KV, "scale_multiplier": 10.0}


def test_a_spec_whose_kv_is_not_its_preset_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(study_runs, "REFERENCE_KV", {**study_runs.REFERENCE_KV, "recent_window": 64})
    with pytest.raises(SystemExit, match="is not preset 'v_scale_layout' applied"):
        study_runs.load_fault_specs(study_runs.FAULTS)


def _paired(delta: float, sd: float, n: int, se_baseline: float = 0.004):
    """A paired-t estimate with the given delta, sd of differences and n (one repeat, no clusters)."""
    a = [1.0, 0.0] * (n // 2)
    est = estimate_from_scores("t", a, a)
    return est.model_copy(update={"delta": delta, "sd_diff": sd, "se_paired": sd / math.sqrt(n), "df": n - 1,
                                  "se_baseline": se_baseline, "ci_method": "paired_t"})


def test_n_to_fail_ni_is_the_gates_t_rule_extrapolated() -> None:
    tp = TaskPolicy(margin=0.02, alpha=0.05)
    # reference, independent of qa: smallest n with -0.05 + t_{0.95, n-1} * 0.1 / sqrt(n) < -0.02
    want = next(n for n in range(2, 1000) if -0.05 + stats.t.ppf(0.95, n - 1) * 0.1 / math.sqrt(n) < -0.02)
    assert want == 32  # the normal approximation, ceil((1.6449 * 0.1 / 0.03)^2) = 31, is 1 short
    assert study_tables.n_to_fail_ni(_paired(-0.05, 0.1, 50), tp) == "32"
    assert study_tables.n_to_fail_ni(_paired(-0.01, 0.1, 50), tp).startswith("never")


def test_n_to_fail_ni_of_a_constant_drop_uses_the_exact_bound() -> None:
    tp = TaskPolicy(margin=0.02, alpha=0.05)
    est = _paired(-0.03, 0.0, 50).model_copy(update={"se_paired": 0.0, "ci_method": "degenerate"})
    # upper limit -0.03 + (1 - 0.05^(1/n)) * 1.03 < -0.02  <=>  n > ln 0.05 / ln(1 - 0.01/1.03) = 307.05
    assert study_tables.n_to_fail_ni(est, tp) == "308"


def test_n_to_fail_sigma_hand_computed() -> None:
    tp = TaskPolicy(sigma_k=1.5, sigma_basis="baseline")
    # fails when 0.007 > 1.5 * 0.004 * sqrt(50 / n)  <=>  n > 50 (0.006 / 0.007)^2 = 36.73
    assert study_tables.n_to_fail_sigma(_paired(-0.007, 0.05, 50, se_baseline=0.004), tp) == "37"
    assert study_tables.n_to_fail_sigma(_paired(0.0, 0.05, 50), tp) == "-"


def test_at_n_scales_every_se_and_the_df() -> None:
    est = _paired(-0.05, 0.1, 50)
    at = study_tables.at_n(est, 200)
    assert at.n == 200 and at.df == 199 and at.delta == est.delta
    assert at.se_paired == pytest.approx(0.1 / math.sqrt(200)) and at.se_baseline == pytest.approx(0.002)


def test_the_refusal_spec_drops_only_the_override() -> None:
    spec = load_spec(ROOT / "examples" / "engines" / "vllm_nvfp4_override.toml")
    assert spec.arms["candidate"].given_args()["allow_unsupported_kv_cache_dtype"] is True
    strict = study_runs.refusal_spec(spec)
    given = strict.arms["candidate"].given_args()
    assert "allow_unsupported_kv_cache_dtype" not in given and given["kv_cache_dtype"] == "nvfp4"
    assert strict.name == spec.name + "-refused" and strict.arms["baseline"] == spec.arms["baseline"]
    assert parse_spec(dump_spec(strict)) == strict  # what the scratch folder's spec.toml holds


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


def test_seed_arm_copies_only_the_spec_tasks_and_detects_a_rerun(tmp_path: Path) -> None:
    source = tmp_path / "source" / "records" / "baseline"
    source.mkdir(parents=True)
    identity = ArmIdentity(name="baseline", model="m", model_file_hash=None, engine="hf", engine_args={},
                           engine_files={}, limit=None, repeats=1, seed=0)
    tasks = {t: TaskEntry(name=t, version="1", config={}, fingerprint=t[0]) for t in ("wikitext_kl", "arc_challenge")}
    ArmManifest(config=identity, fingerprint="f", tasks=tasks).save(source / "arm.json")
    (source / "wikitext_kl.jsonl").write_text('{"x": 1}\n')
    (source / "arc_challenge.jsonl").write_text('{"x": 2}\n')
    run_dir = tmp_path / "run"
    seeded = study_runs.seed_arm(parse_spec(TINY), run_dir, tmp_path / "source", calibration=False)
    arm = run_dir / "records" / "baseline"
    assert set(seeded) == {"wikitext_kl.jsonl"} and not (arm / "arc_challenge.jsonl").exists()
    copied = ArmManifest.load(arm / "arm.json")
    assert set(copied.tasks) == {"wikitext_kl"} and copied.config == identity
    assert (run_dir / "spec.toml").exists()
    assert study_runs.check_unchanged(run_dir, "baseline", seeded)
    (arm / "wikitext_kl.jsonl").write_text('{"x": 1}\n{"x": 3}\n')  # an arm that re-ran appends
    assert not study_runs.check_unchanged(run_dir, "baseline", seeded)


def test_publish_and_load_regate_under_the_recorded_policy(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", kv=False)
    gate(run, parse_policy('name = "wide"\n[default]\nmargin = 0.08'))
    publish(run, tmp_path / "pub", RunInfo(spec="examples/x.toml", exit_code=1, wall_seconds=12.5))
    assert not (tmp_path / "pub" / "records").exists() and (tmp_path / "pub" / "spec.toml").exists()
    pub = load_published(tmp_path / "pub")
    assert pub is not None and pub.info is not None and pub.info.wall_seconds == 12.5
    assert pub.verdict.policy.name == "wide" and pub.verdict.status == pub.recorded_status
    assert load_published(tmp_path / "nothing") is None


@pytest.mark.parametrize(("group", "table"), [("faults", "TABLE.md"), ("engines", "SUMMARY.md")])
def test_tables_rebuild_the_committed_files_from_the_folders(tmp_path: Path, group: str, table: str) -> None:
    folder = tmp_path / group
    shutil.copytree(ROOT / "reports" / group, folder)
    write = study_tables.write_fault_table if group == "faults" else study_tables.write_engine_summary
    assert write(folder).read_text(encoding="utf-8") == (ROOT / "reports" / group / table).read_text(encoding="utf-8")


def test_every_committed_study_run_regates_to_its_recorded_status() -> None:
    for folder in sorted((ROOT / "reports" / "faults").iterdir()) + sorted((ROOT / "reports" / "engines").iterdir()):
        pub = load_published(folder) if folder.is_dir() else None
        if pub is not None:
            assert pub.verdict.status == pub.recorded_status, folder.name


def test_cli_refuses_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert fault_study.main(["faults", "--names", "v_scale_layut"]) == 2  # bad input: exit 2, nothing run
    err = capsys.readouterr().err
    assert err == "error: unknown faults name 'v_scale_layut'; did you mean 'v_scale_layout'?\n"
