"""qa.pipeline.resolve: a spec resolved once. Its tasks' data are read once for everything before the arms
(preflight, dry run, power plan), the record a worker reads builds the same arms (equal configs and arm.json
fingerprints), the policy is recorded with its file and bytes; and resolve_task_options: a spec's [chat]
defaults reach the tasks that can chat, with lm-eval's multiturn default."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from evals import data
from evals.models.resolve import resolve_model
from evals.run.arm import arm_manifest
from evals.run.selection import select_items
from qa.files.resolved_json import ResolvedRecord, text_sha256
from qa.files.spec import ChatSettings, TaskSpec, parse_spec
from qa.pipeline.dry_run import dry_run
from qa.pipeline.preflight import preflight
from qa.pipeline.resolve import resolve_run, resolve_task_options
from qa.pipeline.resolved_run import ResolvedRun, arm_config, arm_tasks
from qa.plan.power import plan_run
from tests.shared_data import shared_data_dir


def test_chat_defaults_apply_to_tasks_that_chat_and_multiturn_follows_chat() -> None:
    chat = ChatSettings(chat=True, system_prompt="Be brief.", chat_template_kwargs={"enable_thinking": False})
    gsm = resolve_task_options(TaskSpec(name="gsm8k_cot_llama"), chat)
    assert gsm.chat and gsm.system_prompt == "Be brief." and gsm.fewshot_as_multiturn  # lm-eval's default with chat
    assert dict(gsm.chat_template_kwargs) == {"enable_thinking": False}
    own = resolve_task_options(TaskSpec(name="gsm8k_cot_llama", fewshot_as_multiturn=False, system_prompt="Own."),
                               chat)
    assert own.chat and not own.fewshot_as_multiturn and own.system_prompt == "Own."  # the task's own settings win
    probe = resolve_task_options(TaskSpec(name="wikitext_kl"), chat)  # cannot chat: [chat] is not applied
    assert not probe.chat and probe.system_prompt is None and not probe.fewshot_as_multiturn
    plain = resolve_task_options(TaskSpec(name="gsm8k"))
    assert not plain.chat and not plain.fewshot_as_multiturn
    assert resolve_task_options(TaskSpec(name="gsm8k", think_tags=[])).think_tags is None


SPEC = """
name = "once"
model = "smollm2-135m"
seed = 3
policy = "policy.toml"
[calibration]
n_samples = 2
[arms.baseline]
engine_args = { batch_size = 4 }
[arms.candidate]
engine_args = { batch_size = 4, kv = { format = "nvfp4", scales = "static", recent_window = 16 } }
[[tasks]]
name = "arc_easy"
limit = 12
[[tasks]]
name = "gsm8k"
limit = 3
num_fewshot = 2
[[tasks]]
name = "wikitext_kl"
limit = 2
"""
POLICY = 'name = "once"\n[default]\nmargin = 0.05\n[tasks.arc_easy]\nlooks = [0.5, 1.0]\n'


def _resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[ResolvedRun, Counter[str]]:
    reads: Counter[str] = Counter()
    if monkeypatch is not None:
        real = data.load

        def counted(name: str, data_dir: Path | None, split: str | None = None) -> list:
            reads[f"{name}/{split or 'eval'}"] += 1
            return real(name, data_dir, split)

        monkeypatch.setattr(data, "load", counted)
    (tmp_path / "policy.toml").write_text(POLICY, encoding="utf-8")
    run = resolve_run(parse_spec(SPEC), tmp_path / "run", data_dir=shared_data_dir("arc_easy"), spec_dir=tmp_path)
    return run, reads


def test_every_task_is_built_and_read_once_for_preflight_dry_run_and_plan(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    run, reads = _resolved(tmp_path, monkeypatch)
    checks = preflight(run, strict=False)
    arms = dry_run(run, checks)
    plan = plan_run(run.tasks, run.policy.policy, run.spec.model)
    assert reads == {"arc_easy/eval": 1, "gsm8k/test": 1, "gsm8k/train": 1, "wikitext2/eval": 1}
    assert [a.name for a in arms] == ["baseline", "candidate"]
    assert [(t.task, t.items) for t in plan.tasks] == [("arc_easy", 12), ("gsm8k", 3), ("wikitext_kl", 2)]
    arc = run.task("arc_easy")
    assert arc.look_sizes == (6, 12) and run.sequential and arc.n_items == len(arc.selection) == 12
    assert arc.first(6, run.seed) == frozenset(it.item_id for it in select_items(arc.selection, 6, run.seed))


def test_the_record_is_what_a_worker_builds_its_arm_from(tmp_path: Path) -> None:
    run, _ = _resolved(tmp_path)
    again = ResolvedRecord.model_validate_json(run.record.model_dump_json())
    assert again == run.record
    model = resolve_model("smollm2-135m")
    for arm in run.arms:
        parent, child = run.config(arm), arm_config(again, again.arm(arm.name))
        assert parent == child
        built = [(t.task, t.options, t.record.limit, t.record.repeats) for t in run.tasks]
        assert arm_manifest(parent, model, built).to_json() == arm_manifest(child, model, built).to_json()
    assert [(t.name, t.options) for t in arm_tasks(again)] == [(t.name, t.options) for t in run.tasks]
    cand = run.arm("candidate")
    assert cand.record.engine_args is not None and cand.record.engine_args["scales"] == str(run.rd.scales)
    assert cand.kv is not None and cand.kv.recent_window == 16 and run.arm("baseline").kv is None
    assert run.record.calibration is not None and run.record.calibration.arm == "candidate"


def test_the_policy_is_recorded_with_its_file_and_bytes(tmp_path: Path) -> None:
    run, _ = _resolved(tmp_path)
    assert run.record.policy.path == str((tmp_path / "policy.toml").resolve())
    assert run.record.policy.sha256 == text_sha256(POLICY) and run.record.policy.name == "once"
    run.rd.save_resolved(run.record, run.policy.text)
    assert run.rd.recorded_policy() == run.policy.policy
    assert run.rd.load_resolved() == run.record
