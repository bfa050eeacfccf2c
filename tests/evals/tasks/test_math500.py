"""MATH-500: the Minerva prompt with its shared few-shot prefix, scored by lm-eval's minerva utils."""

from __future__ import annotations

import pytest

from evals.engines.base import GenerateResult
from evals.errors import EvalError
from evals.tasks import get_task, math500
from evals.tasks.base import Item


def gen(text: str) -> GenerateResult:
    return GenerateResult(text=text, output_tokens=len(text.split()), finish_reason="stop")


def test_prompt_and_prefix() -> None:
    task = get_task("math500")
    req = task.request(Item("x", {"problem": "What is $1+1$?", "solution": "$\\boxed{2}$"}), repeat=0, seed=0)
    assert (
        req.prefix == math500.fewshot_prefix(4)
        and req.prompt == req.prefix + "Problem:\nWhat is $1+1$?\n\nSolution:"
    )
    assert req.prefix.count("Problem:\n") == 4 and req.until == ("Problem:",)


def test_scoring_uses_lm_eval_minerva() -> None:
    task = get_task("math500")
    item = Item("x", {"problem": "p", "solution": "So it is $\\boxed{\\frac{1}{2}}$."})
    try:
        import math_verify  # noqa: F401
    except ImportError:
        with pytest.raises(EvalError, match="lm-eval\\[math\\]"):
            task.score(item, gen("Final Answer: The final answer is $\\frac{1}{2}$. I hope it is correct."))
        return
    right = task.score(
        item, gen(" x.\nFinal Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.")
    )
    assert right.scores["exact_match,none"] == 1.0 and right.target == "\\frac{1}{2}"
    wrong = task.score(item, gen(" x.\nFinal Answer: The final answer is $3$. I hope it is correct."))
    assert wrong.scores["exact_match,none"] == 0.0 and wrong.extracted == {"none": "3"}
