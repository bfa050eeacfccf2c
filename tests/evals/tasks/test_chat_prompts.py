"""Chat prompts are byte-identical to those lm-eval builds with --apply_chat_template (and
--fewshot_as_multiturn, --system_instruction) for the same documents, rendered with
SmolLM2-135M-Instruct's own chat template.

lm-eval's side: its real `ConfigurableTask` from the installed YAML (tests/evals/tasks/test_prompts.py
builds them offline) asked to `build_all_requests` with `apply_chat_template=True`, its chat template
being lm-eval's own `HFLM.apply_chat_template` bound to the model's tokenizer (no weights loaded).
Contexts, continuations, messages and prompt hashes are compared by sha256, so a failure never prints
a document (GPQA's authors ask that questions not be revealed).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import pytest
from lm_eval.api.task import ConfigurableTask
from lm_eval.models.huggingface import HFLM
from lm_eval.utils import hash_string

from evals import data
from evals.engines.base import GenerateRequest, LoglikelihoodRequest
from evals.prompts.chat import chat_template
from evals.records.samples import sha256_text
from evals.tasks import get_task
from evals.tasks.base import Item, TaskOptions
from tests.evals.tasks.test_prompts import DATA_DIR, h, lm_doc, lm_task

MODEL = "smollm2-135m"
N = 3  # documents per comparison (lm-eval's few-shot RNG runs from document 0)
SYSTEM = "You are a careful grader. Think, then answer."

pytestmark = pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data")


class RecordingTemplate:
    """lm-eval's HFLM.apply_chat_template on the model's tokenizer, recording each chat history it renders."""

    def __init__(self, kwargs: dict[str, Any] | None = None) -> None:
        owner = types.SimpleNamespace(tokenizer=chat_template(MODEL).tokenizer, chat_template_args=kwargs or {})
        self._render = functools.partial(HFLM.apply_chat_template, owner)
        self.histories: list[list[dict[str, str]]] = []

    def __call__(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        self.histories.append([dict(m) for m in chat_history])
        return self._render(chat_history, add_generation_prompt=add_generation_prompt)


def lm_chat_requests(task: ConfigurableTask, n: int, multiturn: bool, system: str | None = None,
                     kwargs: dict[str, Any] | None = None) -> tuple[list[list[tuple[Any, ...]]], RecordingTemplate]:
    """lm-eval's request arguments for the first n documents with its chat template applied."""
    template = RecordingTemplate(kwargs)
    task.build_all_requests(limit=n, apply_chat_template=True, fewshot_as_multiturn=multiturn,
                            system_instruction=system, chat_template=template)
    by_doc: dict[int, list[Any]] = {}
    for inst in sorted(task.instances, key=lambda i: (i.doc_id, i.idx)):
        by_doc.setdefault(inst.doc_id, []).append(inst.arguments)
    return [by_doc[i] for i in range(n)], template


def ours(name: str, options: TaskOptions, n: int = N) -> tuple[list[Item], list[Any]]:
    task = get_task(name, options, MODEL)
    items = task.items(DATA_DIR)[:n]
    return items, [task.request(it, repeat=0, seed=0) for it in items]


def messages_of(req: GenerateRequest) -> list[str]:
    return [h(f"{m.role}\x00{m.content}") for m in req.messages]


def assert_gen_chat_identical(name: str, reqs: list[GenerateRequest], theirs: list[list[tuple[Any, ...]]],
                              template: RecordingTemplate) -> None:
    assert len(reqs) == len(theirs) == len(template.histories)
    task = get_task(name, TaskOptions(chat=True), MODEL)
    for req, (args,), history in zip(reqs, theirs, template.histories, strict=True):
        assert req.prompt.startswith("<|im_start|>") and req.prompt.endswith("<|im_start|>assistant\n")
        assert h(req.prompt) == h(args[0]), "rendered prompt differs"
        assert sha256_text(task.prompt_text(req)) == hash_string(args[0]), "prompt hash differs from lm-eval's"
        assert list(req.until) == list(args[1]["until"])
        assert messages_of(req) == [h(f"{m['role']}\x00{m['content']}") for m in history], "messages differ"
        if req.prefix is not None:
            assert req.prompt.startswith(req.prefix)


def test_gsm8k_cot_llama_chat_multiturn_identical() -> None:
    items, mine = ours("gsm8k_cot_llama", TaskOptions(chat=True, fewshot_as_multiturn=True))
    task = lm_task("gsm8k/gsm8k-cot-llama.yaml", {"test": [lm_doc(i.doc) for i in items]})
    assert task.get_config("num_fewshot") == 8
    theirs, template = lm_chat_requests(task, len(items), multiturn=True)
    assert_gen_chat_identical("gsm8k_cot_llama", mine, theirs, template)
    assert all([m.role for m in r.messages] == ["user", "assistant"] * 8 + ["user"] for r in mine)
    assert len({r.prefix for r in mine}) == 1 and mine[0].prefix  # the 8 fixed shots: one cached prefix


def test_gsm8k_cot_llama_chat_single_turn_with_system_identical() -> None:
    opts = TaskOptions(chat=True, system_prompt=SYSTEM)
    items, mine = ours("gsm8k_cot_llama", opts)
    task = lm_task("gsm8k/gsm8k-cot-llama.yaml", {"test": [lm_doc(i.doc) for i in items]})
    theirs, template = lm_chat_requests(task, len(items), multiturn=False, system=SYSTEM)
    assert_gen_chat_identical("gsm8k_cot_llama", mine, theirs, template)
    assert all([m.role for m in r.messages] == ["system", "user"] for r in mine)


def test_gsm8k_cot_llama_plain_identical() -> None:
    items, mine = ours("gsm8k_cot_llama", TaskOptions())
    task = lm_task("gsm8k/gsm8k-cot-llama.yaml", {"test": [lm_doc(i.doc) for i in items]})
    task.build_all_requests(limit=len(items))
    theirs = sorted(task.instances, key=lambda i: i.doc_id)
    assert [h(r.prompt) for r in mine] == [h(i.arguments[0]) for i in theirs]
    assert all(not r.messages for r in mine)


@pytest.mark.parametrize(("name", "yaml_rel"), [("gsm8k_cot_zeroshot", "gsm8k/gsm8k-cot-zeroshot.yaml"),
                                                ("gsm8k", "gsm8k/gsm8k.yaml")])
def test_gsm8k_train_split_tasks_chat_multiturn_identical(name: str, yaml_rel: str) -> None:
    items, mine = ours(name, TaskOptions(chat=True, fewshot_as_multiturn=True))
    train = data.load("gsm8k", DATA_DIR, "train")
    task = lm_task(yaml_rel, {"test": [lm_doc(i.doc) for i in items], "train": train})
    theirs, template = lm_chat_requests(task, len(items), multiturn=True)
    assert_gen_chat_identical(name, mine, theirs, template)
    assert all(r.prefix is None for r in mine)  # zero-shot has no shared shots; gsm8k's differ per item


def test_gpqa_cot_zeroshot_chat_identical() -> None:
    items, mine = ours("gpqa_diamond_cot_zeroshot", TaskOptions(chat=True))
    task = lm_task("gpqa/cot_zeroshot/gpqa_diamond_cot_zeroshot.yaml", {"train": [lm_doc(i.doc) for i in items]},
                   process_docs=None)
    theirs, template = lm_chat_requests(task, len(items), multiturn=False)
    assert_gen_chat_identical("gpqa_diamond_cot_zeroshot", mine, theirs, template)


def assert_ll_chat_identical(mine: list[LoglikelihoodRequest], theirs: list[list[tuple[Any, ...]]]) -> None:
    assert len(mine) == len(theirs)
    for req, args in zip(mine, theirs, strict=True):
        contexts = [c for c, _ in req.pairs()]
        assert [h(c) for c in contexts] == [h(a[0]) for a in args], "context differs"
        assert [h(c) for _, c in req.pairs()] == [h(a[1]) for a in args], "continuations differ"
        assert h(req.context) == h(args[0][0]) and hash_string(args[0][0]) == sha256_text(req.context)
        assert all(c.endswith("<|im_start|>assistant\n") for c in contexts)


@pytest.mark.parametrize(("name", "yaml_rel"), [("arc_challenge", "arc/arc_challenge.yaml"),
                                                ("winogrande", "winogrande/default.yaml"),
                                                ("lambada_openai", "lambada/lambada_openai.yaml")])
def test_loglikelihood_chat_identical(name: str, yaml_rel: str) -> None:
    items, mine = ours(name, TaskOptions(chat=True, system_prompt=SYSTEM))
    task = lm_task(yaml_rel, {"_": [lm_doc(i.doc) for i in items]})
    theirs, _ = lm_chat_requests(task, len(items), multiturn=False, system=SYSTEM)
    assert_ll_chat_identical(mine, theirs)


@pytest.mark.parametrize("multiturn", [False, True])
def test_mmlu_5shot_chat_identical(multiturn: bool) -> None:
    subject = "high_school_biology"
    opts = TaskOptions(num_fewshot=5, chat=True, fewshot_as_multiturn=multiturn)
    task_ours = get_task("mmlu", opts, MODEL)
    items = [i for i in task_ours.items(DATA_DIR) if i.doc["subject"] == subject][:N]
    dev = [d for d in data.load("mmlu", DATA_DIR, "dev") if d["subject"] == subject]
    task = lm_task(f"mmlu/default/mmlu_{subject}.yaml", {"test": [lm_doc(i.doc) for i in items], "dev": dev},
                   num_fewshot=5)
    theirs, template = lm_chat_requests(task, len(items), multiturn=multiturn)
    mine = [task_ours.request(i, repeat=0, seed=0) for i in items]
    assert_ll_chat_identical(mine, theirs)
    assert template.histories[0][0]["role"] == "system"  # lm-eval puts the description in a system turn
    assert all(r.prefix and r.context.startswith(r.prefix) for r in mine)


def test_chat_template_kwargs_reach_the_template_and_the_request() -> None:
    kwargs = {"enable_thinking": False}
    items, mine = ours("gsm8k_cot_llama", TaskOptions(chat=True, fewshot_as_multiturn=True,
                                                      chat_template_kwargs=kwargs), n=1)
    task = lm_task("gsm8k/gsm8k-cot-llama.yaml", {"test": [lm_doc(i.doc) for i in items]})
    theirs, template = lm_chat_requests(task, 1, multiturn=True, kwargs=kwargs)
    assert_gen_chat_identical("gsm8k_cot_llama", mine, theirs, template)
    assert mine[0].chat_template_kwargs == (("enable_thinking", False),)
