"""The KV-scale provenance rule: a candidate meant to run with calibrated scales that ran at 1.0 is a
warning by default and a failure with `require_scales = true`; end to end through `qa.api.gate` and
the report on a copy of a committed run with the candidate's arm.json added."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evals.engines.vllm.kv.record import KVExecution
from evals.provenance.record import KVProvenance, LayerScales
from evals.records.arm_file import ARM_FILE, ArmIdentity, ArmManifest, EngineSummary
from qa import api
from qa.files.policy import default_policy, default_policy_text, parse_policy
from qa.gate.provenance import apply_scales_rule, check_scales, load_kv_provenance
from qa.report import render

COMMITTED = Path(__file__).resolve().parents[3] / "reports" / "engines" / "vllm_bf16_vs_fp8"
LAYERS = [LayerScales(layer=i, format="fp8", k_scale=[1.0], v_scale=[1.0]) for i in range(2)]
MISSING = KVProvenance(source="vllm-offline", kv_dtype="fp8", storage_dtype="uint8", scales_origin="defaulted",
                       scales_expected=True, layers=LAYERS)
UNASKED = MISSING.model_copy(update={"scales_expected": False})
CALIBRATED = KVProvenance(source="hf-emulator", kv_dtype="nvfp4", scales_origin="calibrated", scales_expected=True,
                          scales_sha256="ab" * 32,
                          layers=[LayerScales(layer=0, format="nvfp4", k_scale=[0.01], v_scale=[0.02])])
REQUIRE = parse_policy("require_scales = true\n" + default_policy_text(), "strict.toml")  # the default + the key


def _write_arm(arm_dir: Path, kv: KVProvenance | None) -> None:
    identity = ArmIdentity(name=arm_dir.name, model="m", model_file_hash=None, engine="vllm", engine_args={},
                           engine_files={}, limit=None, repeats=1, seed=0)
    arm_dir.mkdir(parents=True)
    ArmManifest(config=identity, fingerprint="f", tasks={},
                engine_info=EngineSummary(name="vllm", deterministic=False, kv=kv)).save(arm_dir / ARM_FILE)


def test_findings() -> None:
    assert check_scales("c", MISSING).finding == "missing"
    assert "meant to run with calibrated K/V scales but ran with scales defaulted" in check_scales("c", MISSING).message
    assert check_scales("c", UNASKED).finding == "defaulted_unasked"
    assert check_scales("c", CALIBRATED).finding == "ok"
    assert check_scales("c", None).finding == "not_judged"
    unknown = CALIBRATED.model_copy(update={"scales_origin": "unknown"})
    assert check_scales("c", unknown).finding == "missing"  # meant static scales, cannot show them


def test_arm_json_round_trip(tmp_path: Path) -> None:
    _write_arm(tmp_path / "records" / "candidate", MISSING)
    assert load_kv_provenance(tmp_path / "records" / "candidate") == MISSING
    _write_arm(tmp_path / "records" / "old", None)
    assert load_kv_provenance(tmp_path / "records" / "old") is None
    assert load_kv_provenance(tmp_path / "records" / "absent") is None


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    if not (COMMITTED / "comparison.json").is_file():
        pytest.skip("the committed vllm_bf16_vs_fp8 report is missing")
    rd = tmp_path / "run"
    shutil.copytree(COMMITTED, rd)
    return rd


def test_gate_warns_by_default_and_fails_under_require_scales(run_dir: Path) -> None:
    before = api.gate(run_dir, default_policy())  # no arm.json: the rule does not judge
    _write_arm(run_dir / "records" / "candidate", MISSING)
    warned = api.gate(run_dir, default_policy())
    assert warned.status == before.status == "inconclusive"
    assert warned.summary.startswith(before.summary) and "warning: candidate 'candidate' was meant" in warned.summary
    failed = api.gate(run_dir, REQUIRE)
    assert failed.status == "fail" and failed.exit_code == 1
    assert failed.summary.startswith("FAIL: candidate 'candidate' was meant") and "(require_scales)" in failed.summary
    assert [t.status for t in failed.tasks] == [t.status for t in before.tasks]  # tasks decided as before
    paths = render(run_dir, None)
    md = paths.markdown.read_text(encoding="utf-8")
    assert "## KV cache and scales that ran" in md
    assert "| candidate | vllm-offline | fp8 | uint8 | defaulted | 1 1 | 1 1 |" in md
    assert "fails the gate" in md
    assert "KV cache and scales that ran" in paths.html.read_text(encoding="utf-8")


def test_apply_keeps_a_good_candidate_untouched(run_dir: Path) -> None:
    verdict = api.gate(run_dir, REQUIRE)
    assert apply_scales_rule(verdict, check_scales("candidate", CALIBRATED), REQUIRE) == verdict


NVFP4_ONES = KVProvenance(source="vllm-offline", kv_dtype="nvfp4", storage_dtype="uint8", scales_origin="defaulted",
                          layers=[LayerScales(layer=i, format="nvfp4", k_scale=[1.0], v_scale=[1.0]) for i in range(2)])
CONSTANT_ONE = KVProvenance(source="hf-emulator", kv_dtype="nvfp4", scales_origin="constant", constant_scale=1.0)
# our NVFP4 folder (decode scales amax/2688) run by vLLM-CPU with kv_cache_dtype fp8
NVFP4_AS_FP8 = KVProvenance(source="vllm-offline", kv_dtype="fp8", storage_dtype="uint8", scales_origin="checkpoint",
                            scales_expected=True, scales_convention="nvfp4-decode",
                            layers=[LayerScales(layer=0, format="fp8", k_scale=[0.004], v_scale=[0.002])])
# a global scale amax/6 read as vLLM's NVFP4 decode multiplier
GLOBAL_AS_NVFP4 = CALIBRATED.model_copy(update={"scales_convention": "nvfp4-global"})


def test_nvfp4_at_scale_one_and_mismatched_conventions_fail_require_scales(run_dir: Path) -> None:
    for kv in (NVFP4_ONES, CONSTANT_ONE):  # asked for NVFP4, ran at 1.0: asked for scales or not
        check = check_scales("c", kv)
        assert check.finding == "missing" and "asked for an NVFP4 KV cache but ran with every K/V scale 1.0" \
            in check.message
    check = check_scales("c", NVFP4_AS_FP8)
    assert check.finding == "mismatch"
    assert ("its fp8 KV cache reads scales as fp8-decode (amax / 448) but they are nvfp4-decode (amax / 2688): "
            "decode scales 6x too small") in check.message
    glob = check_scales("c", GLOBAL_AS_NVFP4)
    assert glob.finding == "mismatch" and "nvfp4-global (amax / 6): decode scales 448x too large" in glob.message
    assert check_scales("c", CALIBRATED.model_copy(update={"scales_convention": "nvfp4-decode"})).finding == "ok"
    assert check_scales("c", CALIBRATED.model_copy(update={"scales_convention": "nvfp4-encode"})).finding == "ok"
    _write_arm(run_dir / "records" / "candidate", NVFP4_AS_FP8)
    warned = api.gate(run_dir, default_policy())
    assert warned.status != "fail" and "warning: candidate 'candidate' ran with K/V scales in a mismatched" \
        in warned.summary
    failed = api.gate(run_dir, REQUIRE)
    assert failed.status == "fail" and failed.summary.startswith("FAIL: candidate 'candidate' ran with K/V scales "
                                                                 "in a mismatched convention")
    assert "fails the gate" in render(run_dir, None).markdown.read_text(encoding="utf-8")


LOOSE = 'version = 1\n[default]\nmargin = 0.5\nmin_n = 2\n[tasks.wikitext_kl]\nmetric = "top1_acc,none"\n'


def test_an_arm_refused_by_its_proof_of_execution_is_never_a_pass(run_dir: Path) -> None:
    loose = parse_policy(LOOSE, "loose.toml")
    comp = json.loads((run_dir / "comparison.json").read_text(encoding="utf-8"))
    comp["estimates"] = [e for e in comp["estimates"] if e["task"] != "gsm8k"]  # no information there: never a pass
    (run_dir / "comparison.json").write_text(json.dumps(comp), encoding="utf-8")
    passing = api.gate(run_dir, loose)
    assert passing.status == "pass"  # the committed run passes at a loose margin: only the refusal changes that
    refused = KVExecution(expected_tokens=100, requests=2, exact=True,
                          refusal="layer 3 rewrote 0 of 100 tokens vLLM computed")
    identity = ArmIdentity(name="candidate", model="m", model_file_hash=None, engine="vllm", engine_args={},
                           engine_files={}, limit=None, repeats=1, seed=0)
    arm_dir = run_dir / "records" / "candidate"
    arm_dir.mkdir(parents=True)
    ArmManifest(config=identity, fingerprint="f", tasks={}, engine_info=EngineSummary(
        name="vllm", deterministic=False, kv=CALIBRATED, kv_execution=refused)).save(arm_dir / ARM_FILE)
    verdict = api.gate(run_dir, loose)
    assert verdict.status == "inconclusive" and verdict.exit_code == 3
    assert verdict.summary.startswith("INCONCLUSIVE: arm 'candidate' was refused after it ran: layer 3 rewrote 0")
