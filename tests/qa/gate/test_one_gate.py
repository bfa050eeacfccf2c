"""One gate: `qa gate`, `qa report`, `qa run` and the API decide the same run folders the same way, with and
without `require_scales` (the scales rule included everywhere), on a copy of a committed vLLM run whose
candidate's arm.json says it was meant to use calibrated K/V scales and ran with 1.0."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qa import api
from qa.cli import main
from qa.files.policy import default_policy_text, load_policy
from qa.files.rundir import RunDir
from qa.files.verdict import Verdict
from qa.pipeline import stages
from qa.pipeline.resolve import resolve_run
from qa.report.gather import gather
from tests.qa.gate.test_provenance import COMMITTED, MISSING, _write_arm
from tests.shared_data import shared_data_dir


def _outcome(verdict: Verdict) -> tuple[str, tuple[tuple[str, str], ...], bool]:
    return verdict.status, tuple((t.task, t.status) for t in verdict.tasks), "(require_scales)" in verdict.summary


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    if not (COMMITTED / "comparison.json").is_file():
        pytest.skip("the committed vllm_bf16_vs_fp8 report is missing")
    run = tmp_path / "run"
    shutil.copytree(COMMITTED, run)
    _write_arm(run / "records" / "candidate", MISSING)
    return run


@pytest.mark.parametrize("require", [False, True])
def test_gate_report_run_and_api_agree(run_dir: Path, tmp_path: Path, require: bool) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(f"require_scales = {str(require).lower()}\n" + default_policy_text().replace(
        'name = "default"', 'name = "one-gate"'), encoding="utf-8")
    outcomes: dict[str, tuple[str, tuple[tuple[str, str], ...], bool]] = {}

    with pytest.raises(SystemExit) as info:  # qa gate RUN --policy P
        main(["gate", str(run_dir), "--policy", str(policy)])
    outcomes["qa gate"] = _outcome(RunDir(run_dir).load_verdict())
    assert info.value.code == RunDir(run_dir).load_verdict().exit_code
    outcomes["api.gate"] = _outcome(api.gate(run_dir, policy))
    with pytest.raises(SystemExit) as info:  # qa report RUN --policy P: re-gated for the report
        main(["report", str(run_dir), "--policy", str(policy)])
    assert info.value.code == 0
    outcomes["qa report"] = _outcome(gather(run_dir, load_policy(policy)).verdict)  # what report.md shows
    spec = RunDir(run_dir).load_spec().model_copy(update={"policy": str(policy)})
    resolved = resolve_run(spec, run_dir, data_dir=shared_data_dir("wikitext2"), spec_dir=None)
    outcomes["qa run"] = _outcome(stages.gate_and_report(resolved))  # the steps `qa run` ends with
    md = RunDir(run_dir).report_md.read_text(encoding="utf-8")
    assert len(set(outcomes.values())) == 1, outcomes
    status, _, failed_on_scales = outcomes["qa gate"]
    assert failed_on_scales is require and (status == "fail") is require  # the scales rule decided it
    assert ("fails the gate" in md) is require


def test_a_runs_recorded_policy_regates_it_from_any_working_directory(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's main job names its policy relative to its spec's folder: `qa gate RUN` needs no --policy,
    from any working directory, and a policy.toml changed behind the run's back is one error line, exit 2."""
    if not (COMMITTED / "comparison.json").is_file():
        pytest.skip("the committed vllm_bf16_vs_fp8 report is missing")
    examples = Path(__file__).resolve().parents[3] / "examples"
    run = tmp_path / "run"
    shutil.copytree(COMMITTED, run)
    spec = RunDir(run).load_spec().model_copy(update={"policy": "policies/smollm2_nvfp4_kv.toml"})
    monkeypatch.chdir(tmp_path)  # not the examples folder: the relative path resolves against spec_dir
    resolved = resolve_run(spec, run, data_dir=shared_data_dir("wikitext2"), spec_dir=examples)
    assert resolved.record.policy.path == str((examples / "policies" / "smollm2_nvfp4_kv.toml").resolve())
    resolved.rd.save_resolved(resolved.record, resolved.policy.text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(SystemExit):
        main(["gate", str(run)])
    assert RunDir(run).load_verdict().policy.name == "smollm2-nvfp4-kv"
    assert RunDir(run).load_verdict().policy_sha256 == resolved.policy.policy.sha256()
    (run / "policy.toml").write_text(resolved.policy.text + "\n# edited\n", encoding="utf-8")
    with pytest.raises(SystemExit) as info:
        main(["gate", str(run)])
    assert info.value.code == 2
