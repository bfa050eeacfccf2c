"""MATH-500, as lm-eval's `minerva_math500` task (lm_eval/tasks/minerva_math, version 3.1): the
4-shot Minerva prompt, greedy generation until "Problem:", exact match after Minerva's answer
normalisation, plus lm-eval's math_verify check.

Hendrycks et al. 2021, "Measuring Mathematical Problem Solving With the MATH Dataset",
arXiv:2103.03874; the 500-problem subset of Lightman et al. 2023, arXiv:2305.20050; prompt and
normalisation from Lewkowycz et al. 2022 (Minerva), arXiv:2206.14858, appendix D.

Prompt: the four fixed Minerva examples, each "Problem:\\n{problem}\\n\\nSolution: {solution}\\n\\n"
(lm-eval's `first_n` sampler over `list_fewshot_samples`), then "Problem:\\n{problem}\\n\\nSolution:".
The block is shared by every item (the request's `prefix`).

Scoring calls lm-eval's own `minerva_math/utils.process_results` (imported when first scoring), so
it needs lm-eval's math extras (sympy, math-verify, antlr4-python3-runtime 4.11); without them
`score` raises EvalError with the install line. Its sympy equivalence check uses SIGALRM for a
5-second timeout, so score in the main thread. The target is lm-eval's: the normalised content of
the last \\boxed{} in the reference solution (not the dataset's `answer` field).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from evals import data
from evals.data import Row
from evals.engines.base import GenerateResult
from evals.errors import EvalError
from evals.prompts.chat import ChatRenderer, ChatTemplate
from evals.tasks.base import Item, Request, Result, Scored, TaskKind, TaskOptions
from evals.tasks.common import (
    GenSettings,
    chat_renderer,
    check_options,
    fewshot_block,
    gen_settings,
    generate_prompt,
    reference_continuation,
    resolve_fewshot,
    row_items,
    task_version,
    text_generate_request,
)

UNTIL = ("Problem:",)
MINERVA_UTILS = "lm_eval.tasks.minerva_math.utils"
MATH_EXTRAS_HINT = "pip install 'lm-eval[math]' (sympy, math-verify, antlr4-python3-runtime==4.11)"

# lm_eval/tasks/minerva_math/utils.py list_fewshot_samples(): (problem, solution), in order.
MINERVA_SHOTS: tuple[tuple[str, str], ...] = (
    (
        "Find the domain of the expression  $\\frac{\\sqrt{x-2}}{\\sqrt{5-x}}$.",
        "The expressions inside each square root must be non-negative. Therefore, $x-2 \\ge 0$, so $x\\ge2$, and $5 - x \\ge 0$, so $x \\le 5$. Also, the denominator cannot be equal to zero, so $5-x>0$, which gives $x<5$. Therefore, the domain of the expression is $\\boxed{[2,5)}$.\nFinal Answer: The final answer is $[2,5)$. I hope it is correct.",
    ),
    (
        "If $\\det \\mathbf{A} = 2$ and $\\det \\mathbf{B} = 12,$ then find $\\det (\\mathbf{A} \\mathbf{B}).$",
        "We have that $\\det (\\mathbf{A} \\mathbf{B}) = (\\det \\mathbf{A})(\\det \\mathbf{B}) = (2)(12) = \\boxed{24}.$\nFinal Answer: The final answer is $24$. I hope it is correct.",
    ),
    (
        "Terrell usually lifts two 20-pound weights 12 times. If he uses two 15-pound weights instead, how many times must Terrell lift them in order to lift the same total weight?",
        "If Terrell lifts two 20-pound weights 12 times, he lifts a total of $2\\cdot 12\\cdot20=480$ pounds of weight.  If he lifts two 15-pound weights instead for $n$ times, he will lift a total of $2\\cdot15\\cdot n=30n$ pounds of weight.  Equating this to 480 pounds, we can solve for $n$:\n\\begin{align*}\n30n&=480\\\\\n\\Rightarrow\\qquad n&=480/30=\\boxed{16}\n\\end{align*}\nFinal Answer: The final answer is $16$. I hope it is correct.",
    ),
    (
        "If the system of equations\n\n\\begin{align*}\n6x-4y&=a,\\\\\n6y-9x &=b.\n\\end{align*}has a solution $(x, y)$ where $x$ and $y$ are both nonzero,\nfind $\\frac{a}{b},$ assuming $b$ is nonzero.",
        "If we multiply the first equation by $-\\frac{3}{2}$, we obtain\n\n$$6y-9x=-\\frac{3}{2}a.$$Since we also know that $6y-9x=b$, we have\n\n$$-\\frac{3}{2}a=b\\Rightarrow\\frac{a}{b}=\\boxed{-\\frac{2}{3}}.$$\nFinal Answer: The final answer is $-\\frac{2}{3}$. I hope it is correct.",
    ),
)


def doc_to_text(doc: Row) -> str:
    """lm-eval minerva_math utils.doc_to_text: "Problem:\\n" + problem + "\\n\\nSolution:"."""
    return "Problem:" + "\n" + doc["problem"] + "\n\n" + "Solution:"


def fewshot_prefix(k: int) -> str:
    """The first k Minerva examples, rendered as lm-eval renders few-shot turns."""
    return fewshot_block("", [(doc_to_text({"problem": p}), s) for p, s in MINERVA_SHOTS[:k]])


def minerva_utils() -> ModuleType:
    """lm-eval's minerva_math utils module; EvalError with the install line when its extras are missing."""
    try:
        return importlib.import_module(MINERVA_UTILS)
    except (ImportError, AssertionError):
        raise EvalError(
            f"math500 scoring uses lm-eval's minerva_math utils, which need its math extras: {MATH_EXTRAS_HINT}"
        ) from None


def gold_answer(solution: str, utils: ModuleType) -> str:
    """lm-eval minerva process_docs: normalise(remove_boxed(last \\boxed{} of the solution))."""
    return utils.normalize_final_answer(utils.remove_boxed(utils.last_boxed_only_string(solution)))


@dataclass(frozen=True)
class Math500Task:
    """MATH-500 test problems, Minerva 4-shot prompt (shared prefix)."""

    num_fewshot: int
    settings: GenSettings
    chat: ChatRenderer | None = None
    think_tags: tuple[str, str] | None = None
    name: str = "math500"
    version: str = task_version(1, "3.1")
    kind: TaskKind = "generate"

    def items(self, data_dir: Path | None) -> list[Item]:
        """The 500 problems in file order, id = the dataset's unique_id."""
        return row_items(data.load("math500", data_dir))

    def request(self, item: Item, *, repeat: int, seed: int) -> Request:
        """Generate after the shared Minerva block + the problem, until "Problem:"."""
        shots = [(doc_to_text({"problem": p}), s) for p, s in MINERVA_SHOTS[: self.num_fewshot]]
        return text_generate_request(self.chat, self.settings, seed, doc_to_text(item.doc), shots,
                                     fewshot_prefix(self.num_fewshot))

    def prompt_text(self, request: Request) -> str:
        """The full context string (lm-eval's prompt hash input)."""
        return generate_prompt(request)

    def reference(self, item: Item) -> str:
        """The dataset's worked solution, after "Solution:" as the Minerva shots write theirs."""
        return reference_continuation(item.doc["solution"], self.chat is not None)

    def score(self, item: Item, result: Result) -> Scored:
        """exact_match and math_verify from lm-eval's own minerva process_results."""
        assert isinstance(result, GenerateResult)
        utils = minerva_utils()
        target = gold_answer(item.doc["solution"], utils)
        doc: dict[str, Any] = {
            "problem": item.doc["problem"],
            "solution": item.doc["solution"],
            "answer": target,
        }
        res = utils.process_results(doc, [result.text])
        extracted = utils.normalize_final_answer(utils.get_unnormalized_answer(result.text))
        scores: dict[str, float | None] = {f"{k},none": float(v) for k, v in res.items()}
        return Scored(scores=scores, extracted={"none": extracted}, target=target)


def build(name: str, options: TaskOptions, template: ChatTemplate | None = None) -> Math500Task:
    """MATH-500 with lm-eval's defaults (4 shots) unless the options override them."""
    k = resolve_fewshot(name, options, len(MINERVA_SHOTS), "minerva")
    if k > len(MINERVA_SHOTS):
        raise EvalError(
            f"{name}: num_fewshot {k}; lm-eval's Minerva prompt has {len(MINERVA_SHOTS)} examples"
        )
    check_options(name, options, generates=True, chats=True)
    return Math500Task(num_fewshot=k, settings=gen_settings(options, UNTIL), chat=chat_renderer(name, options, template),
                       think_tags=options.think_tags)
