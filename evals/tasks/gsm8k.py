"""GSM8K, 5-shot, as lm-eval's `gsm8k` task (lm_eval/tasks/gsm8k/gsm8k.yaml, version 3.0).

Cobbe et al. 2021, "Training Verifiers to Solve Math Word Problems", arXiv:2110.14168.

Prompt: k training examples "Question: {q}\\nAnswer: {full solution}\\n\\n", then
"Question: {q}\\nAnswer:"; greedy generation until "Question:". lm-eval draws the shots with its
default sampler: one `random.Random(1234)` for the whole run, 5 training examples sampled per test
document in document order, so every item has its own few-shot block (nothing is shared, so the
request carries no cacheable `prefix`). Two answer filters, both scored by exact match after
lm-eval's normalisation (case, commas, "$", a trailing ".", everything up to "#### "):
strict-match takes the number after "#### "; flexible-extract takes the last number in the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lm_eval.api.metrics import exact_match_hf_evaluate
from lm_eval.filters.extraction import RegexFilter

from evals import data
from evals.engines.base import GenerateResult
from evals.tasks.base import Item, Request, Result, Scored, TaskKind, TaskOptions
from evals.tasks.common import (
    LM_EVAL_MAX_GEN_TOKS,
    exact_match_scored,
    fewshot_block,
    generate_prompt,
    generate_request,
    resolve_fewshot,
    sequential_fewshot_indices,
    task_version,
)

DEFAULT_FEWSHOT = 5
UNTIL = ("Question:", "</s>", "<|im_end|>")
STRICT_REGEX = r"#### (\-?[0-9\.\,]+)"  # strict-match: the number after "#### "
FLEXIBLE_REGEX = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"  # flexible-extract: the last number-like span
FILTERS: dict[str, RegexFilter] = {
    "strict-match": RegexFilter(regex_pattern=STRICT_REGEX),
    "flexible-extract": RegexFilter(regex_pattern=FLEXIBLE_REGEX, group_select=-1),
}
EXACT_MATCH_KWARGS = {  # gsm8k.yaml metric_list: exact_match
    "ignore_case": True,
    "ignore_punctuation": False,
    "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"],
}


def doc_to_text(doc: dict[str, str]) -> str:
    """lm-eval gsm8k: "Question: {{question}}\\nAnswer:"."""
    return f"Question: {doc['question']}\nAnswer:"


def extract(completion: str) -> dict[str, str]:
    """The answer each filter extracts ("[invalid]" when its regex finds nothing)."""
    return {name: f.apply([[completion]], [{}])[0][0] for name, f in FILTERS.items()}


def exact_match(extracted: str, target: str) -> float:
    """lm-eval's exact_match with gsm8k's normalisation, 1.0 or 0.0."""
    return float(
        exact_match_hf_evaluate(predictions=[extracted], references=[target], **EXACT_MATCH_KWARGS)[
            "exact_match"
        ]
    )


@dataclass(frozen=True)
class Gsm8kTask:
    """GSM8K test split, k-shot from the train split (lm-eval's sampler and seed)."""

    num_fewshot: int
    max_tokens: int
    temperature: float
    name: str = "gsm8k"
    version: str = task_version(1, "3.0")
    kind: TaskKind = "generate"

    def items(self, data_dir: Path | None) -> list[Item]:
        """The 1319 test problems in file order, each with its own few-shot block."""
        test = data.load("gsm8k", data_dir, "test")
        train = data.load("gsm8k", data_dir, "train") if self.num_fewshot else []
        picks = (
            sequential_fewshot_indices(len(train), len(test), self.num_fewshot) if self.num_fewshot else []
        )
        items = []
        for i, doc in enumerate(test):
            shots = [(doc_to_text(train[j]), train[j]["answer"]) for j in picks[i]] if picks else []
            items.append(Item(item_id=doc["id"], doc=doc, fewshot=fewshot_block("", shots)))
        return items

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """Generate after the item's few-shot block + question, until "Question:"."""
        prompt = item.fewshot + doc_to_text(item.doc)
        return generate_request(prompt, UNTIL, self.max_tokens, self.temperature, seed)

    def prompt_text(self, request: Request) -> str:
        """The full context string (lm-eval's prompt hash input)."""
        return generate_prompt(request)

    def score(self, item: Item, result: Result) -> Scored:
        """exact_match under both filters; the target is the full reference solution, as lm-eval logs it."""
        assert isinstance(result, GenerateResult)
        return exact_match_scored(extract(result.text), item.doc["answer"], exact_match)


def build(name: str, options: TaskOptions) -> Gsm8kTask:
    """GSM8K with lm-eval's defaults unless the options override them."""
    return Gsm8kTask(
        num_fewshot=resolve_fewshot(name, options, DEFAULT_FEWSHOT, "train"),
        max_tokens=options.max_tokens or LM_EVAL_MAX_GEN_TOKS,
        temperature=options.temperature or 0.0,
    )
