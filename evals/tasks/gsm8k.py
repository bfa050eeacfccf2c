"""GSM8K, as lm-eval's `gsm8k` (5-shot, version 3.0), `gsm8k_cot_llama` (8 fixed chain-of-thought
shots, version 4.0) and `gsm8k_cot_zeroshot` (version 3.0) tasks (lm_eval/tasks/gsm8k/*.yaml).

Cobbe et al. 2021, "Training Verifiers to Solve Math Word Problems", arXiv:2110.14168. The CoT shots
of gsm8k_cot_llama are Wei et al. 2022's (arXiv:2201.11903), as Meta's Llama 3 evaluations use them.

- gsm8k: k training examples "Question: {q}\\nAnswer: {full solution}\\n\\n", then
  "Question: {q}\\nAnswer:"; lm-eval's default sampler draws the shots (one `random.Random(1234)`
  for the whole run, k training examples per test document in document order), so every item has its
  own few-shot block and the request carries no cacheable `prefix`. strict-match: the number after
  "#### "; flexible-extract: the last number in the text.
- gsm8k_cot_llama: "Given the following problem, reason and give a final answer ...", the 8 shots of
  its YAML in order (`first_n`), target delimiter "", answers ending "The final answer is N";
  meant for chat with multi-turn shots (`chat = true`, `fewshot_as_multiturn = true`). strict-match:
  the number after "The final answer is"; flexible-extract: the last number.
- gsm8k_cot_zeroshot: "Q: {q}\\nA: Let's think step by step."; strict-match: "The answer is N.".

Every filter is scored by exact match after lm-eval's normalisation (case, commas, "$", a trailing
".", everything up to "#### "). With `chat = true` the prompt is lm-eval's --apply_chat_template one
(evals.prompts.chat), rendered with the model's template.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lm_eval.filters.extraction import RegexFilter

from evals import data
from evals.data import Row
from evals.engines.base import GenerateResult
from evals.errors import EvalError
from evals.prompts.chat import ChatRenderer, ChatTemplate
from evals.tasks.base import Item, Request, Result, Scored, TaskKind, TaskOptions
from evals.tasks.common import (
    FEWSHOT_DELIMITER,
    GenSettings,
    chat_renderer,
    check_options,
    gen_settings,
    generate_prompt,
    reference_continuation,
    resolve_fewshot,
    sequential_fewshot_indices,
    task_version,
    text_generate_request,
)
from evals.tasks.exact_match import Normalisation, exact_match_scored

FLEXIBLE_REGEX = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"  # flexible-extract: the last number-like span
NORMALISATION = Normalisation(  # every gsm8k YAML's metric_list: exact_match
    ignore_case=True, ignore_punctuation=False, regexes_to_ignore=(",", "\\$", "(?s).*#### ", "\\.$"))

# gsm8k-cot-llama.yaml fewshot_config.samples: (question, target), in order.
COT_LLAMA_SHOTS: tuple[tuple[str, str], ...] = (
    (
        (
            "There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are "
            "done, there will be 21 trees. How many trees did the grove workers plant today?"
        ),
        (
            "There are 15 trees originally. Then there were 21 trees after some more were planted. So there must "
            "have been 21 - 15 = 6. The final answer is 6"
        ),
    ),
    (
        "If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
        "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The final answer is 5",
    ),
    (
        (
            "Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in "
            "total?"
        ),
        (
            "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After "
            "eating 35, they had 74 - 35 = 39. The final answer is 39"
        ),
    ),
    (
        (
            "Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many lollipops"
            " did Jason give to Denny?"
        ),
        (
            "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny 20 - 12"
            " = 8. The final answer is 8"
        ),
    ),
    (
        (
            "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does he"
            " have now?"
        ),
        (
            "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. 5 +"
            " 4 = 9. The final answer is 9"
        ),
    ),
    (
        (
            "There were nine computers in the server room. Five more computers were installed each day, from "
            "monday to thursday. How many computers are now in the server room?"
        ),
        (
            "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 "
            "computers were added. 9 + 20 is 29. The final answer is 29"
        ),
    ),
    (
        (
            "Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How many"
            " golf balls did he have at the end of wednesday?"
        ),
        (
            "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing 2 "
            "more, he had 35 - 2 = 33 golf balls. The final answer is 33"
        ),
    ),
    (
        "Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
        (
            "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 "
            "dollars left. 23 - 15 is 8. The final answer is 8"
        ),
    ),
)


def doc_to_text(doc: Row) -> str:
    """lm-eval gsm8k: "Question: {{question}}\\nAnswer:"."""
    return f"Question: {doc['question']}\nAnswer:"


def cot_llama_text(doc: Row) -> str:
    """lm-eval gsm8k_cot_llama doc_to_text (ends with a newline)."""
    return ("Given the following problem, reason and give a final answer to the problem.\nProblem: "
            f"{doc['question']}\nYour response should end with \"The final answer is [answer]\" where [answer] is "
            "the response to the problem.\n")


def cot_zeroshot_text(doc: Row) -> str:
    """lm-eval gsm8k_cot_zeroshot: "Q: {{question}}\\nA: Let's think step by step."."""
    return f"Q: {doc['question']}\nA: Let's think step by step."


@dataclass(frozen=True)
class Variant:
    """What distinguishes lm-eval's GSM8K tasks: prompt, shots, target, filters, stop strings."""

    lm_eval_version: str
    doc_to_text: Callable[[Row], str]
    doc_to_target: Callable[[Row], str]
    strict: RegexFilter
    until: tuple[str, ...]
    default_fewshot: int
    fixed_shots: tuple[tuple[str, str], ...] | None  # None: sampled from the train split per item
    target_delimiter: str = " "


VARIANTS: dict[str, Variant] = {
    "gsm8k": Variant("3.0", doc_to_text, lambda d: d["answer"], RegexFilter(regex_pattern=r"#### (\-?[0-9\.\,]+)"),
                     ("Question:", "</s>", "<|im_end|>"), 5, None),
    "gsm8k_cot_llama": Variant(
        "4.0", cot_llama_text, lambda d: d["answer"].split("####")[-1].strip(),
        RegexFilter(regex_pattern=r"The final answer is ((-?[$0-9.,]{2,})|(-?[0-9]+))", group_select=-1),
        ("<|eot_id|>", "<|start_header_id|>user<|end_header_id|>", "Q:", "</s>", "<|im_end|>"), 8,
        COT_LLAMA_SHOTS, target_delimiter=""),
    "gsm8k_cot_zeroshot": Variant("3.0", cot_zeroshot_text, lambda d: d["answer"],
                                  RegexFilter(regex_pattern=r"The answer is (\-?[0-9\.\,]+)."),
                                  ("Q:", "</s>", "<|im_end|>"), 0, None),
}
FLEXIBLE = RegexFilter(regex_pattern=FLEXIBLE_REGEX, group_select=-1)


def extract(completion: str, variant: Variant | None = None) -> dict[str, str]:
    """The answer each filter extracts ("[invalid]" when its regex finds nothing)."""
    strict = (variant or VARIANTS["gsm8k"]).strict
    return {name: f.apply([[completion]], [{}])[0][0] for name, f in (("strict-match", strict),
                                                                       ("flexible-extract", FLEXIBLE))}


@dataclass(frozen=True)
class Gsm8kTask:
    """GSM8K test split under one of lm-eval's GSM8K prompts, plain or chat."""

    name: str
    num_fewshot: int
    settings: GenSettings
    chat: ChatRenderer | None = None
    think_tags: tuple[str, str] | None = None
    version: str = task_version(1, "3.0")
    kind: TaskKind = "generate"

    @property
    def variant(self) -> Variant:
        """This task's lm-eval definition."""
        return VARIANTS[self.name]

    def items(self, data_dir: Path | None) -> list[Item]:
        """The 1319 test problems in file order, each with its shots (lm-eval's sampler and seed)."""
        v = self.variant
        test = data.load("gsm8k", data_dir, "test")
        if v.fixed_shots is not None or not self.num_fewshot:
            shots = (v.fixed_shots or ())[: self.num_fewshot]
            fixed = tuple((v.doc_to_text({"question": q}), a) for q, a in shots)
            return [self.make_item(doc, fixed) for doc in test]
        train = data.load("gsm8k", data_dir, "train")
        picks = sequential_fewshot_indices(len(train), len(test), self.num_fewshot)
        return [self.make_item(doc, tuple((v.doc_to_text(train[j]), train[j]["answer"]) for j in picks[i]))
                for i, doc in enumerate(test)]

    def make_item(self, doc: Row, shots: tuple[tuple[str, str], ...]) -> Item:
        """The Item of one test document with these shots (plain block: q + target delimiter + a + "\n\n")."""
        delim = self.variant.target_delimiter
        block = "".join(q + delim + a + FEWSHOT_DELIMITER for q, a in shots)
        return Item(item_id=doc["id"], doc=doc, fewshot=block, shots=shots)

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """Generate after the shots + question (plain or chat) until the task's stop strings; shots shared
        by every item (fixed ones) are the cacheable prefix."""
        return text_generate_request(self.chat, self.settings, seed, self.variant.doc_to_text(item.doc), item.shots,
                                     item.fewshot, shared=self.variant.fixed_shots is not None)

    def prompt_text(self, request: Request) -> str:
        """The full prompt, rendered (lm-eval's prompt hash input)."""
        return generate_prompt(request)

    def reference(self, item: Item) -> str:
        """lm-eval's target (gsm8k, gsm8k_cot_zeroshot: the worked solution; gsm8k_cot_llama: the number)
        as the continuation of the prompt."""
        v = self.variant
        return reference_continuation(v.doc_to_target(item.doc), self.chat is not None, v.target_delimiter)

    def score(self, item: Item, result: Result) -> Scored:
        """exact_match under both filters against lm-eval's target (gsm8k: the full reference solution)."""
        assert isinstance(result, GenerateResult)
        target = self.variant.doc_to_target(item.doc)
        return exact_match_scored(extract(result.text, self.variant), target, NORMALISATION)


def build(name: str, options: TaskOptions, template: ChatTemplate | None = None) -> Gsm8kTask:
    """The named GSM8K task with lm-eval's defaults unless the options override them."""
    v = VARIANTS[name]
    check_options(name, options, generates=True, chats=True)
    k = resolve_fewshot(name, options, v.default_fewshot, "train" if v.fixed_shots is None else "fixed")
    if v.fixed_shots is not None and k > len(v.fixed_shots):
        raise EvalError(f"{name}: num_fewshot {k}; lm-eval's {name} has {len(v.fixed_shots)} fixed examples")
    renderer = chat_renderer(name, options, template, target_delimiter=v.target_delimiter)
    return Gsm8kTask(name=name, num_fewshot=k, settings=gen_settings(options, v.until), chat=renderer,
                     think_tags=options.think_tags, version=task_version(1, v.lm_eval_version))
