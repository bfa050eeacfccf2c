"""GPQA (diamond, main, extended), zero-shot, as lm-eval's `gpqa_<subset>_zeroshot` (multiple
choice by log-likelihood) and `gpqa_<subset>_cot_zeroshot` (chain-of-thought generation) tasks
(lm_eval/tasks/gpqa/zeroshot and cot_zeroshot, version 2.2).

Rein et al. 2023, "GPQA: A Graduate-Level Google-Proof Q&A Benchmark", arXiv:2311.12022.
Items are identified by the dataset's Record ID; question text is never logged or printed.

Option order. lm-eval's `process_docs` puts the three incorrect answers and the correct one in a
list and calls the *global* `random.shuffle` on it, document by document in file order.
`simple_evaluate` seeds `random` with 0 (DEFAULT_RANDOM_SEED) just before building the tasks, and
with the hub dataset cached the evaluation docs are that first pass over the split (the datasets
`map` result is cached, so the second `process_docs` call lm-eval makes returns it). Running one
GPQA task alone therefore shuffles with the sequence of `random.Random(0)`; that is what
`shuffle_choices` does, with a local generator (no global state). Two GPQA tasks in one lm-eval
run, or a fresh in-memory dataset, would continue the sequence instead: those orders differ.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lm_eval.filters.extraction import MultiChoiceRegexFilter, RegexFilter

from evals import data
from evals.data import Row
from evals.engines.base import GenerateResult
from evals.prompts.chat import ChatRenderer, ChatTemplate
from evals.tasks.base import Item, Request, Result, Scored, TaskKind, TaskOptions
from evals.tasks.common import (
    RANDOM_SEED,
    GenSettings,
    gen_settings,
    generate_prompt,
    reference_continuation,
    row_items,
    task_version,
    text_generate_request,
    zero_shot_chat,
)
from evals.tasks.exact_match import Normalisation, exact_match_scored
from evals.tasks.multiple_choice import MCBuilder, MultipleChoiceTask, zero_shot_builder

LM_EVAL_VERSION = "2.2"
SHUFFLE_SEED = RANDOM_SEED  # simple_evaluate's random.seed(0) before process_docs runs
LETTERS = ["(A)", "(B)", "(C)", "(D)"]
COT_UNTIL = ("</s>",)
STRICT_REGEX = (
    r"(?<=The answer is )(.*)(?=.)"  # strict-match: text after "The answer is ", less its last char
)
FLEXIBLE_REGEX = r"(\([A-Z]\))"  # flexible-extract: the last "(X)", else a choice's text, else ": X"
NORMALISATION = Normalisation(ignore_case=True, ignore_punctuation=True)  # the cot_zeroshot YAML's metric_list


def preprocess(text: str | None) -> str:
    """lm-eval gpqa utils.preprocess: strip, " [title]" -> ". ", double spaces -> single."""
    if text is None:
        return " "
    return text.strip().replace(" [title]", ". ").replace("  ", " ")


def shuffle_choices(rows: list[Row], seed: int = SHUFFLE_SEED) -> list[Row]:
    """lm-eval gpqa process_docs with `random.Random(seed)`: adds choice1..4, choices, answer "(X)"."""
    rnd = random.Random(seed)
    out = []
    for doc in rows:
        choices = [
            preprocess(doc[k]) for k in ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
        ]
        choices.append(preprocess(doc["Correct Answer"]))
        rnd.shuffle(choices)
        gold = choices.index(preprocess(doc["Correct Answer"]))
        out.append(
            {
                **doc,
                "choice1": choices[0],
                "choice2": choices[1],
                "choice3": choices[2],
                "choice4": choices[3],
                "choices": list(choices),
                "answer": LETTERS[gold],
            }
        )
    return out


def _choices_block(doc: Row) -> str:
    return (
        f"Choices:\n(A) {doc['choice1']}\n(B) {doc['choice2']}\n(C) {doc['choice3']}\n(D) {doc['choice4']}\n"
    )


def zeroshot_text(doc: Row) -> str:
    """lm-eval gpqa zeroshot doc_to_text (no space after the colon, as in the YAML)."""
    return f"What is the correct answer to this question:{doc['Question']}\n{_choices_block(doc)}Answer:"


def cot_text(doc: Row) -> str:
    """lm-eval gpqa cot_zeroshot doc_to_text (ends with a space)."""
    return f"What is the correct answer to this question:{doc['Question']}\n{_choices_block(doc)}Let's think step by step: "


def extract(completion: str, doc: Row) -> dict[str, str]:
    """The answer each lm-eval filter extracts ("[invalid]" when nothing is found)."""
    strict = RegexFilter(regex_pattern=STRICT_REGEX)
    flexible = MultiChoiceRegexFilter(
        regex_pattern=FLEXIBLE_REGEX, group_select=-1, ignore_case=True, ignore_punctuation=True
    )
    return {
        "strict-match": strict.apply([[completion]], [doc])[0][0],
        "flexible-extract": flexible.apply([[completion]], [doc])[0][0],
    }


@dataclass(frozen=True)
class GpqaCotTask:
    """Zero-shot chain of thought; exact match of the extracted "(X)" under two filters."""

    name: str
    dataset: str
    settings: GenSettings
    chat: ChatRenderer | None = None
    think_tags: tuple[str, str] | None = None
    version: str = task_version(1, LM_EVAL_VERSION)
    kind: TaskKind = "generate"

    def items(self, data_dir: Path | None) -> list[Item]:
        """Every question of the subset, choices shuffled as lm-eval does, id = Record ID."""
        return row_items(shuffle_choices(data.load(self.dataset, data_dir)))

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """Generate after the question and its choices (plain or chat); only a chat prompt's head (system
        turn, user header) is shared by every item."""
        return text_generate_request(self.chat, self.settings, seed, cot_text(item.doc))

    def prompt_text(self, request: Request) -> str:
        """The full context string (lm-eval's prompt hash input)."""
        return generate_prompt(request)

    def reference(self, item: Item) -> str:
        """The gold letter and the gold choice's text ("(B) ..."), after the prompt (never printed)."""
        doc = item.doc
        gold = doc["choices"][LETTERS.index(doc["answer"])]
        return reference_continuation(f"{doc['answer']} {gold}", self.chat is not None, "")

    def score(self, item: Item, result: Result) -> Scored:
        """exact_match,strict-match and exact_match,flexible-extract against the gold letter."""
        assert isinstance(result, GenerateResult)
        return exact_match_scored(extract(result.text, item.doc), item.doc["answer"], NORMALISATION)


def _zeroshot(subset: str) -> MCBuilder:
    return zero_shot_builder(
        version=task_version(1, LM_EVAL_VERSION),
        dataset=f"gpqa_{subset}",
        doc_to_text=zeroshot_text,
        doc_to_choice=lambda d: list(LETTERS),
        doc_to_target=lambda d: d["answer"],
        process_docs=shuffle_choices,
    )


def _cot(subset: str) -> Callable[[str, TaskOptions, ChatTemplate | None], GpqaCotTask]:
    def make(name: str, options: TaskOptions, template: ChatTemplate | None) -> GpqaCotTask:
        chat = zero_shot_chat(name, options, template, generates=True)
        return GpqaCotTask(name=name, dataset=f"gpqa_{subset}", settings=gen_settings(options, COT_UNTIL),
                           chat=chat, think_tags=options.think_tags)

    return make


BUILDERS: dict[str, Callable[[str, TaskOptions, ChatTemplate | None], MultipleChoiceTask | GpqaCotTask]] = {
    "gpqa_diamond_zeroshot": _zeroshot("diamond"),
    "gpqa_main_zeroshot": _zeroshot("main"),
    "gpqa_extended_zeroshot": _zeroshot("extended"),
    "gpqa_diamond_cot_zeroshot": _cot("diamond"),
    "gpqa_main_cot_zeroshot": _cot("main"),
    "gpqa_extended_cot_zeroshot": _cot("extended"),
}


def build(name: str, options: TaskOptions, template: ChatTemplate | None = None) -> MultipleChoiceTask | GpqaCotTask:
    """The named GPQA task (a key of BUILDERS)."""
    return BUILDERS[name](name, options, template)
