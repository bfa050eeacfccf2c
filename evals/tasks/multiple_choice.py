"""Multiple-choice tasks scored by log-likelihood, as lm-eval defines them: ARC-Easy/Challenge,
PIQA, BoolQ and MMLU (and, through `MultipleChoiceTask`, GPQA zero-shot and TruthfulQA).

Each choice is scored as the continuation `" " + choice` of the context (with `chat = true`: the
context is lm-eval's --apply_chat_template prompt, ending with the assistant's turn opened, and the
continuation is the bare choice, as lm-eval's construct_requests makes it); acc = the highest
log-likelihood is the gold choice, acc_norm = the same after dividing by the choice's length in
characters (lm-eval's `multiple_choice` output type). Prompts are lm-eval's YAML templates:

- arc_easy / arc_challenge (lm_eval/tasks/arc/arc_easy.yaml, v1.0): "Question: {question}\\nAnswer:"
  (Clark et al. 2018, arXiv:1803.05457)
- piqa (lm_eval/tasks/piqa/piqa.yaml, v1.0): "Question: {goal}\\nAnswer:" (Bisk et al. 2020)
- boolq (lm_eval/tasks/super_glue/boolq/default.yaml, v2.0): "{passage}\\nQuestion: {question}?\\nAnswer:"
  with choices no/yes (Clark et al. 2019)
- mmlu (lm_eval/tasks/mmlu/default, v1.0): per-subject description, lettered choices, few-shot
  from the subject's dev split in file order (`first_n`); lm-eval's default is zero-shot
  (Hendrycks et al. 2021, arXiv:2009.03300)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evals import data
from evals.data import Row
from evals.engines.base import LoglikelihoodRequest, LoglikelihoodResult
from evals.errors import EvalError
from evals.prompts.chat import ChatRenderer, ChatTemplate
from evals.tasks.base import Item, Request, Result, Scored, TaskKind, TaskOptions
from evals.tasks.common import (
    TARGET_DELIMITER,
    chat_renderer,
    check_options,
    fewshot_block,
    loglikelihood_context,
    mc_scores,
    reference_continuation,
    resolve_fewshot,
    task_version,
)

MCScorer = Callable[[Row, Sequence[float], list[str]], dict[str, float | None]]


def _no_description(doc: Row) -> str:
    return ""


@dataclass(frozen=True)
class MultipleChoiceTask:
    """A log-likelihood multiple-choice task built from lm-eval's doc_to_text / doc_to_choice /
    doc_to_target. Few-shot shots (when k > 0) are the first k rows of `fewshot_split` sharing the
    document's `fewshot_group` (lm-eval's `first_n` sampler over a per-subject split)."""

    name: str
    version: str
    dataset: str
    doc_to_text: Callable[[Row], str]
    doc_to_choice: Callable[[Row], list[str]]
    doc_to_target: Callable[[Row], int | str]
    metrics: tuple[str, ...] = ("acc", "acc_norm")
    description: Callable[[Row], str] = _no_description
    num_fewshot: int = 0
    fewshot_split: str | None = None
    fewshot_group: Callable[[Row], str] | None = None
    process_docs: Callable[[list[Row]], list[Row]] | None = None
    scorer: MCScorer | None = None  # None: acc / acc_norm from `metrics`
    shared_text: str = ""  # a leading part of every doc_to_text (TruthfulQA's primer): cacheable
    chat: ChatRenderer | None = None
    kind: TaskKind = "loglikelihood"

    def items(self, data_dir: Path | None) -> list[Item]:
        """Every document of the evaluation split, with its description + few-shot block attached."""
        rows = data.load(self.dataset, data_dir)
        if self.process_docs is not None:
            rows = self.process_docs(rows)
        pool = data.load(self.dataset, data_dir, self.fewshot_split) if self.num_fewshot else []
        items = []
        for row in rows:
            shots = self._shots(row, pool)
            items.append(Item(item_id=row["id"], doc=row, fewshot=fewshot_block(self.description(row), shots),
                              shots=tuple(shots)))
        return items

    def _shots(self, doc: Row, pool: list[Row]) -> list[tuple[str, str]]:
        shots: list[tuple[str, str]] = []
        if self.num_fewshot:
            group = self.fewshot_group(doc) if self.fewshot_group else None
            candidates = [r for r in pool if self.fewshot_group is None or self.fewshot_group(r) == group]
            if len(candidates) < self.num_fewshot:
                raise EvalError(
                    f"{self.name}: {self.num_fewshot} shots requested, the few-shot split has "
                    f"{len(candidates)} for item {doc['id']}"
                )
            for shot in candidates[: self.num_fewshot]:
                choices = self.doc_to_choice(shot)
                shots.append((self.doc_to_text(shot), choices[self.gold_index(shot, choices)]))
        return shots

    def gold_index(self, doc: Row, choices: list[str]) -> int:
        """The gold choice's index (lm-eval: an int target is an index, a str target is a choice)."""
        target = self.doc_to_target(doc)
        gold = choices.index(target) if isinstance(target, str) else target
        if not 0 <= gold < len(choices):
            raise EvalError(
                f"{self.name}: item {doc['id']}: gold {target!r} is not one of {len(choices)} choices"
            )
        return gold

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """Score `" " + choice` for every choice given the few-shot block + this document's text; the
        part shared by every item (description, shots, a fixed primer) is the cacheable `prefix`. Chat:
        the rendered chat prompt, the bare choices, the rendered text before the document as prefix."""
        text = self.doc_to_text(item.doc)
        if self.chat is not None:
            chat = self.chat.prompt(self.description(item.doc), item.shots, text)
            return LoglikelihoodRequest(context=chat.text, continuations=tuple(self.doc_to_choice(item.doc)),
                                        prefix=chat.prefix)
        block = item.fewshot
        shared = block + self.shared_text if text.startswith(self.shared_text) else block
        return LoglikelihoodRequest(
            context=block + text,
            continuations=tuple(TARGET_DELIMITER + c for c in self.doc_to_choice(item.doc)),
            prefix=shared or None,
        )

    def prompt_text(self, request: Request) -> str:
        """lm-eval's prompt hash input: the context string."""
        return loglikelihood_context(request)

    def reference(self, item: Item) -> str:
        """The gold choice as its request scores it (" " + choice; the bare choice under chat)."""
        choices = self.doc_to_choice(item.doc)
        return reference_continuation(choices[self.gold_index(item.doc, choices)], self.chat is not None)

    def score(self, item: Item, result: Result) -> Scored:
        """acc / acc_norm (or the task's own scorer); `extracted` is the argmax choice index."""
        assert isinstance(result, LoglikelihoodResult)
        choices = self.doc_to_choice(item.doc)
        target = self.doc_to_target(item.doc)
        lls = result.loglikelihoods
        if len(lls) != len(choices):
            raise EvalError(
                f"{self.name}: item {item.item_id}: {len(lls)} log-likelihoods for {len(choices)} choices"
            )
        if self.scorer is not None:
            scores = self.scorer(item.doc, lls, choices)
        else:
            scores = mc_scores(lls, self.gold_index(item.doc, choices), choices, self.metrics)
        return Scored(scores=scores, extracted={"none": str(int(np.argmax(lls)))}, target=str(target))


# ----------------------------------------------------------------------------- the tasks


def arc_text(doc: Row) -> str:
    """lm-eval arc: "Question: {{question}}\\nAnswer:"."""
    return f"Question: {doc['question']}\nAnswer:"


def arc_target(doc: Row) -> int:
    """lm-eval arc: "{{choices.label.index(answerKey)}}"."""
    return doc["choices"]["label"].index(doc["answerKey"])


def piqa_text(doc: Row) -> str:
    """lm-eval piqa: "Question: {{goal}}\\nAnswer:"."""
    return f"Question: {doc['goal']}\nAnswer:"


def boolq_text(doc: Row) -> str:
    """lm-eval boolq: "{{passage}}\\nQuestion: {{question}}?\\nAnswer:"."""
    return f"{doc['passage']}\nQuestion: {doc['question']}?\nAnswer:"


BOOLQ_CHOICES = ["no", "yes"]
MMLU_CHOICES = ["A", "B", "C", "D"]


def mmlu_text(doc: Row) -> str:
    """lm-eval mmlu default: question stripped, then lettered choices, then "Answer:"."""
    c = doc["choices"]
    return f"{doc['question'].strip()}\nA. {c[0]}\nB. {c[1]}\nC. {c[2]}\nD. {c[3]}\nAnswer:"


def mmlu_description(doc: Row) -> str:
    """lm-eval mmlu/_generate_configs.py: the subject with spaces, then a blank line."""
    return f"The following are multiple choice questions (with answers) about {doc['subject'].replace('_', ' ')}.\n\n"


MCBuilder = Callable[[str, TaskOptions, ChatTemplate | None], MultipleChoiceTask]


def mc_chat(name: str, options: TaskOptions, template: ChatTemplate | None) -> ChatRenderer | None:
    """A multiple-choice task's chat renderer (None without chat), every option it cannot read refused."""
    check_options(name, options, generates=False, chats=True)
    return chat_renderer(name, options, template)


def zero_shot_builder(dataset: str | None = None, **fields: Any) -> MCBuilder:
    """A builder of the zero-shot MultipleChoiceTask with these fields (dataset None: the task's name)."""

    def make(name: str, options: TaskOptions, template: ChatTemplate | None) -> MultipleChoiceTask:
        resolve_fewshot(name, options, 0, None)
        return MultipleChoiceTask(name=name, dataset=dataset or name, chat=mc_chat(name, options, template),
                                  **fields)

    return make


_arc = zero_shot_builder(
    version=task_version(1, "1.0"),
    doc_to_text=arc_text,
    doc_to_choice=lambda d: list(d["choices"]["text"]),
    doc_to_target=arc_target,
)
_piqa = zero_shot_builder(
    version=task_version(1, "1.0"),
    dataset="piqa",
    doc_to_text=piqa_text,
    doc_to_choice=lambda d: [d["sol1"], d["sol2"]],
    doc_to_target=lambda d: d["label"],
)
_boolq = zero_shot_builder(
    version=task_version(1, "2.0"),
    dataset="boolq",
    doc_to_text=boolq_text,
    doc_to_choice=lambda d: list(BOOLQ_CHOICES),
    doc_to_target=lambda d: d["label"],
    metrics=("acc",),
)


def _mmlu(name: str, options: TaskOptions, template: ChatTemplate | None) -> MultipleChoiceTask:
    k = resolve_fewshot(name, options, 0, "dev")
    if k > 5:
        raise EvalError(f"{name}: num_fewshot {k}; the MMLU dev split has 5 examples per subject")
    return MultipleChoiceTask(
        name=name,
        version=task_version(1, "1.0"),
        dataset="mmlu",
        doc_to_text=mmlu_text,
        doc_to_choice=lambda d: list(MMLU_CHOICES),
        doc_to_target=lambda d: d["answer"],
        metrics=("acc",),
        description=mmlu_description,
        num_fewshot=k,
        fewshot_split="dev",
        fewshot_group=lambda d: d["subject"],
        chat=mc_chat(name, options, template),
    )


BUILDERS: dict[str, MCBuilder] = {
    "arc_challenge": _arc,
    "arc_easy": _arc,
    "piqa": _piqa,
    "boolq": _boolq,
    "mmlu": _mmlu,
}


def build(name: str, options: TaskOptions, template: ChatTemplate | None = None) -> MultipleChoiceTask:
    """The named multiple-choice task (a key of BUILDERS)."""
    return BUILDERS[name](name, options, template)
