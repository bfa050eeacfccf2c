"""GPQA (diamond, main, extended) generative chain of thought in the model-card style:
`gpqa_<subset>_cot_modelcard`, as OpenAI's simple-evals runs it (gpqa_eval.py with common.py's
QUERY_TEMPLATE_MULTICHOICE and ANSWER_PATTERN_MULTICHOICE) and model cards report it: zero-shot, the
choices shuffled anew for every sample, "Answer: X" extracted, K repeats at temperature > 0 averaged
per item (the run's `repeats`; pairing averages repeats per item).

Rein et al. 2023, "GPQA: A Graduate-Level Google-Proof Q&A Benchmark", arXiv:2311.12022.

Choice order: simple-evals draws `rng.sample(range(4), 4)` per (question, repeat) over
[correct, incorrect 1, incorrect 2, incorrect 3]. Here the generator is `random.Random` seeded with
"gpqa-modelcard/<record id>/<repeat>", so the permutation depends only on the item and the repeat:
both arms, any limit and a resumed run see the same order. It is recorded with every sample
(SampleRecord.meta["permutation"]: shown position i holds original choice perm[i], 0 = correct).
Defaults follow simple-evals' ChatCompletionSampler: temperature 0.5, max_tokens 1024, top_p 1.
Question text is never logged or printed: items are named by Record ID.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evals import data
from evals.data import Row
from evals.engines.base import GenerateResult
from evals.prompts.chat import ChatRenderer, ChatTemplate
from evals.tasks.base import Item, Request, Result, Scored, TaskKind, TaskOptions
from evals.tasks.common import (
    GenSettings,
    gen_settings,
    generate_prompt,
    row_items,
    text_generate_request,
    zero_shot_chat,
)

VERSION = "1+simple-evals"  # this toolkit's revision + the reference it follows (not an lm-eval task)
LETTERS = "ABCD"
QUERY_TEMPLATE = (  # simple-evals common.py QUERY_TEMPLATE_MULTICHOICE (stripped)
    "Answer the following multiple choice question. The last line of your response should be of the following "
    "format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by step before "
    "answering.\n\n{Question}\n\nA) {A}\nB) {B}\nC) {C}\nD) {D}"
)
STRICT_PATTERN = re.compile(r"(?i)Answer[ \t]*:[ \t]*\$?([A-D])\$?")  # simple-evals: the first match
# flexible-extract: the last "Answer: X", "answer is X" or "answer is (X)" anywhere in the answer
FLEXIBLE_PATTERN = re.compile(r"(?i)answer(?:[ \t]+is)?[ \t]*:?[ \t]*\**\(?\$?([A-D])\b")
DEFAULT_TEMPERATURE = 0.5  # simple-evals ChatCompletionSampler
DEFAULT_MAX_TOKENS = 1024  # simple-evals ChatCompletionSampler
UNTIL: tuple[str, ...] = ()  # simple-evals sets no stop strings: EOS or max_tokens ends a sample
PERMUTATION_SEED = "gpqa-modelcard"


def permutation(item_id: str, repeat: int) -> list[int]:
    """The shown order of [correct, incorrect 1-3] for one sample: a seeded `rng.sample(range(4), 4)`."""
    return random.Random(f"{PERMUTATION_SEED}/{item_id}/{repeat}").sample(range(4), 4)


def original_choices(doc: Row) -> list[str]:
    """simple-evals' choice list before shuffling: the correct answer, then the three incorrect ones."""
    return [doc["Correct Answer"], doc["Incorrect Answer 1"], doc["Incorrect Answer 2"], doc["Incorrect Answer 3"]]


def query(doc: Row, perm: Sequence[int]) -> str:
    """The user message: simple-evals' template with the choices in `perm` order."""
    shown = [original_choices(doc)[i] for i in perm]
    return QUERY_TEMPLATE.format(Question=doc["Question"], A=shown[0], B=shown[1], C=shown[2], D=shown[3])


def gold_letter(perm: Sequence[int]) -> str:
    """The letter under which the correct answer (original choice 0) is shown."""
    return LETTERS[list(perm).index(0)]


def extract(answer: str) -> dict[str, str | None]:
    """The letter each filter finds (None when none): strict-match as simple-evals, flexible-extract the last."""
    strict = STRICT_PATTERN.search(answer)
    flexible = FLEXIBLE_PATTERN.findall(answer)
    return {"strict-match": strict.group(1).upper() if strict else None,
            "flexible-extract": flexible[-1].upper() if flexible else None}


@dataclass(frozen=True)
class GpqaModelCardTask:
    """Zero-shot CoT with per-sample shuffled choices; exact match of the extracted letter."""

    name: str
    dataset: str
    settings: GenSettings
    chat: ChatRenderer | None = None
    think_tags: tuple[str, str] | None = None
    version: str = VERSION
    kind: TaskKind = "generate"

    def items(self, data_dir: Path | None) -> list[Item]:
        """Every question of the subset in file order, id = Record ID (choices are shuffled per sample)."""
        return row_items(data.load(self.dataset, data_dir))

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """The question with this repeat's choice order, as one user message (chat) or plain text."""
        return text_generate_request(self.chat, self.settings, seed, query(item.doc, permutation(item.item_id, repeat)))

    def prompt_text(self, request: Request) -> str:
        """The full prompt, rendered."""
        return generate_prompt(request)

    def score(self, item: Item, result: Result) -> Scored:
        """Refused: the gold letter depends on the repeat (the runner calls `score_repeat`)."""
        raise TypeError(f"{self.name}: the choice order depends on the repeat; score with score_repeat")

    def score_repeat(self, item: Item, result: Result, repeat: int) -> Scored:
        """exact_match,strict-match and exact_match,flexible-extract against the repeat's gold letter;
        the permutation goes to the record's meta."""
        assert isinstance(result, GenerateResult)
        perm = permutation(item.item_id, repeat)
        target = gold_letter(perm)
        extracted = extract(result.text)
        scores: dict[str, float | None] = {f"exact_match,{k}": float(v == target) for k, v in extracted.items()}
        return Scored(scores=scores, extracted=extracted, target=target,
                      meta={"permutation": ",".join(map(str, perm))})


def build(name: str, options: TaskOptions, template: ChatTemplate | None = None) -> GpqaModelCardTask:
    """The named GPQA model-card task (gpqa_<subset>_cot_modelcard)."""
    subset = name.removeprefix("gpqa_").removesuffix("_cot_modelcard")
    chat = zero_shot_chat(name, options, template, generates=True)
    settings = gen_settings(options, UNTIL, DEFAULT_MAX_TOKENS, temperature=DEFAULT_TEMPERATURE)
    return GpqaModelCardTask(name=name, dataset=f"gpqa_{subset}", settings=settings, chat=chat,
                             think_tags=options.think_tags)
