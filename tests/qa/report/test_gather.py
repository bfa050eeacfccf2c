"""qa.report.gather: which verdict a report shows, kv_inspect.json read with quant.kv.inspect.load_inspect,
the engines' determinism from arm.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

from evals.records.arm_file import ArmIdentity, ArmManifest, EngineSummary
from qa.api import gate
from qa.files.policy import default_policy, parse_policy
from qa.files.rundir import RunDir
from qa.report.gather import gather, read_arm_engines, read_kv, resolve_verdict
from qa.report.notes import engine_notes
from quant.kv.inspect import InspectReport
from tests.qa.gate_fixtures import make_run_dir
from tests.qa.report.conftest import PROMPTS, TOKENS, write_kv


def test_stale_verdict_is_regated_under_its_own_policy(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", kv=False)
    rd = RunDir(run)
    gate(run, parse_policy('name = "wide"\n[default]\nmargin = 0.08'))
    comp = rd.load_comparison()
    v, source = resolve_verdict(rd, comp, None)
    assert source == "verdict.json" and v.policy.name == "wide"
    rd.comparison.write_text(rd.comparison.read_text() + "\n")  # other bytes, same numbers
    v2, source2 = resolve_verdict(rd, comp, None)
    assert source2.startswith("re-evaluated") and v2.policy.name == "wide"
    assert v2.comparison_sha256 == rd.comparison_sha256() != v.comparison_sha256
    v3, source3 = resolve_verdict(rd, comp, default_policy())
    assert v3.policy.name == "default" and "policy 'default'" in source3


def test_without_verdict_json_the_runs_policy_decides(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", kv=False)
    rd = RunDir(run)
    comp = rd.load_comparison()
    v, source = resolve_verdict(rd, comp, None)  # spec.toml names no policy: the shipped default
    assert v.policy.name == "default" and source.startswith("no verdict.json") and "'default'" in source
    (run / "wide.toml").write_text('name = "wide"\n[default]\nmargin = 0.08\n')
    rd.spec_file.write_text('policy = "wide.toml"\n' + rd.spec_file.read_text())
    v2, source2 = resolve_verdict(rd, comp, None)
    assert v2.policy.name == "wide" and "'wide'" in source2


def test_kv_inspect_round_trips_through_save_and_load(tmp_path: Path, inspect_report: InspectReport) -> None:
    rd = RunDir(tmp_path)
    assert read_kv(rd) == (None, None)  # absent: no section, no complaint
    write_kv(tmp_path, inspect_report)
    assert "Infinity" in rd.kv_inspect.read_text()  # the skipped layer's exact SQNR
    kv, problem = read_kv(rd)
    assert problem is None and kv == inspect_report
    assert (kv.n_prompts, kv.tokens_per_prompt, [r.format for r in kv.layers]) == (PROMPTS, TOKENS, ["nvfp4", "none"])
    assert math.isinf(kv.layers[1].k.sqnr_db) and 10 < kv.layers[0].k.sqnr_db < 40


def test_an_invalid_kv_inspect_is_a_problem_line_not_a_crash(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    rd.kv_inspect.write_text(json.dumps({"layers": [{"layer": 0, "k_sqnr_db": 20.5, "v_sqnr_db": 19}]}))
    kv, problem = read_kv(rd)
    assert kv is None and problem is not None and "not a kv-inspect report" in problem
    rd.kv_inspect.write_text("not json")
    assert read_kv(rd)[0] is None and "not a kv-inspect report" in (read_kv(rd)[1] or "")


def test_arm_engines_come_from_arm_json(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", kv=False)
    rd = RunDir(run)
    for arm, engine, deterministic in (("baseline", "hf", True), ("candidate", "vllm", False)):
        identity = ArmIdentity(name=arm, model="m", model_file_hash=None, engine=engine, engine_args={},
                               engine_files={}, limit=None, repeats=1, seed=0)
        info = EngineSummary(name=engine, deterministic=deterministic)
        ArmManifest(config=identity, fingerprint="f", tasks={}, engine_info=info).save(rd.arm_records(arm) / "arm.json")
    (run / "records" / "rerun").mkdir()
    (run / "records" / "rerun" / "arm.json").write_text("{}")  # not a manifest: skipped
    arms = read_arm_engines(rd)
    got = [(a.arm, a.engine, a.deterministic) for a in arms]
    assert got == [("baseline", "hf", True), ("candidate", "vllm", False)]
    inp = gather(run)
    assert inp.arms == arms
    (note,) = engine_notes(inp)
    assert note.startswith("arm candidate: engine 'vllm' is not deterministic") and "add an [arms.rerun]" in note
    identity = ArmIdentity(name="rerun", model="m", model_file_hash=None, engine="vllm", engine_args={},
                           engine_files={}, limit=None, repeats=1, seed=0)
    ArmManifest(config=identity, fingerprint="f", tasks={},
                engine_info=EngineSummary(name="vllm", deterministic=False)).save(rd.arm_records("rerun") / "arm.json")
    notes = engine_notes(gather(run))  # a run with a rerun arm is not told to add one
    assert len(notes) == 2 and all("the run's rerun arm measures that noise floor" in n for n in notes)


def test_gather_reads_every_file_through_rundir(tmp_path: Path, inspect_report: InspectReport) -> None:
    run = make_run_dir(tmp_path / "run", kv=False)
    write_kv(run, inspect_report)
    inp = gather(run)
    assert inp.kv == inspect_report and inp.kv_problem is None
    assert inp.env is not None and inp.env["git_sha"] == "abc123"
    assert inp.spec_text is not None and inp.spec_text.startswith('name = "t"')
    assert set(inp.examples) == {"arc_challenge", "mmlu", "gpqa_diamond_zeroshot", "gsm8k"}
    assert inp.examples["arc_challenge"] == []  # no records for it
    gpqa = inp.examples["gpqa_diamond_zeroshot"]
    assert len(gpqa) == 5 and all(e.target is None and e.completion_baseline is None for e in gpqa)
