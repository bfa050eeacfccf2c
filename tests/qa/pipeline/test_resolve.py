"""qa.pipeline.resolve: a spec resolved once. Its tasks' data are read once for everything before the arms
(preflight, dry run, power plan), each model is looked up once and nowhere after, a server's kv spec is one
typed object from the spec to what a worker reads back, the record a worker reads builds the same arms (equal configs and arm.json
fingerprints), the policy is recorded with its file and bytes; and resolve_task_options: a spec's [chat]
defaults reach the tasks that can chat, with lm-eval's multiturn default."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

import qa.pipeline.resolve
from evals import data
from evals.models.resolve import ResolvedModel, resolve_model
from evals.run.arm import arm_manifest
from evals.run.selection import select_items
from evals.servers.spec import VllmServerSpec
from qa.files.resolved_json import ResolvedRecord, text_sha256
from qa.files.spec import ChatSettings, TaskSpec, parse_spec
from qa.pipeline.dry_run import dry_run
from qa.pipeline.fits import check_items_fit
from qa.pipeline.preflight import preflight
from qa.pipeline.resolve import resolve_run, resolve_task_options
from qa.pipeline.resolved_run import ResolvedRun, arm_config, arm_tasks, server_spec
from qa.pipeline.resume import arm_complete
from qa.plan.power import plan_run
from quant.kv.spec import KVQuantSpec, kv_spec_to_json
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


def test_each_model_is_resolved_once_and_nothing_after_resolve_looks_it_up(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up: Counter[str] = Counter()
    real = qa.pipeline.resolve.resolve_model

    def counted(name: str) -> ResolvedModel:
        looked_up[name] += 1
        return real(name)

    monkeypatch.setattr(qa.pipeline.resolve, "resolve_model", counted)
    run, _ = _resolved(tmp_path)
    assert looked_up == {"smollm2-135m": 1}  # two arms, one model: one lookup

    def refused(name: str) -> ResolvedModel:
        raise AssertionError(f"{name} looked up again after resolve")

    for module in [m for n, m in list(sys.modules.items()) if n.startswith("qa.pipeline.")]:
        if hasattr(module, "resolve_model"):
            monkeypatch.setattr(module, "resolve_model", refused)
    dry_run(run, preflight(run, strict=False))
    check_items_fit(run)
    assert not any(arm_complete(run, a) for a in run.arms)  # no records yet; the model is the resolved one


SERVED = """
name = "served"
model = "smollm2-135m"
[arms.baseline]
engine = "openai"
server = { kind = "vllm", args = { max_model_len = 2048 } }
[arms.candidate]
engine = "openai"
server = { kind = "vllm", args = { max_model_len = 2048 }, kv = { format = "qa_int4", skip_layers = [0] } }
[[tasks]]
name = "arc_easy"
limit = 2
"""


def test_a_servers_kv_spec_is_one_typed_object_from_the_spec_to_the_worker(tmp_path: Path) -> None:
    spec = parse_spec(SERVED)
    run = resolve_run(spec, tmp_path / "run", data_dir=shared_data_dir("arc_easy"), spec_dir=tmp_path)
    cand = run.arm("candidate")
    assert isinstance(cand.server, VllmServerSpec) and cand.server.kv is spec.arms["candidate"].server.kv  # type: ignore[union-attr]
    assert cand.record.server is not None and cand.record.server.spec["kv"] == kv_spec_to_json(cand.server.kv)
    run.rd.save_resolved(run.record, run.policy.text)
    back = server_spec(run.rd.load_resolved().arm("candidate"))  # what the worker starts
    assert back == cand.server and isinstance(back, VllmServerSpec) and isinstance(back.kv, KVQuantSpec)
    base = server_spec(run.record.arm("baseline"))
    assert isinstance(base, VllmServerSpec) and base.kv is None
