"""What lm-eval tasks share: the few-shot sampler and block, acc / acc_norm, and shot-count checks."""

from __future__ import annotations

import pytest
from lm_eval.api.samplers import ContextSampler

from evals.errors import EvalError
from evals.tasks import get_task
from evals.tasks.base import TaskOptions
from evals.tasks.common import fewshot_block, mc_scores, sequential_fewshot_indices


def test_fewshot_draws_match_lm_eval_sampler() -> None:
    pool = list(range(7473))
    sampler = ContextSampler(pool, rnd=1234)
    expected = [list(sampler.sample(5)) for _ in range(3)]
    assert sequential_fewshot_indices(7473, 3, 5) == expected


def test_fewshot_block() -> None:
    assert fewshot_block("", [("Q", "A")]) == "Q A\n\n"
    assert fewshot_block("D\n\n", [("Q1", "A1"), ("Q2", "A2")]) == "D\n\nQ1 A1\n\nQ2 A2\n\n"
    assert fewshot_block("D\n\n", []) == "D\n\n"


def test_acc_and_acc_norm_by_hand() -> None:
    # ll/len: -1/1 = -1.0 vs -2/4 = -0.5: raw argmax is 0, length-normalised argmax is 1
    assert mc_scores([-1.0, -2.0], 1, ["a", "bbbb"]) == {"acc,none": 0.0, "acc_norm,none": 1.0}
    assert mc_scores([-1.0, -2.0], 0, ["a", "bbbb"]) == {"acc,none": 1.0, "acc_norm,none": 0.0}
    with pytest.raises(EvalError):
        mc_scores([-1.0], 0, ["a", "b"])


def test_fewshot_options() -> None:
    assert get_task("mmlu", TaskOptions(num_fewshot=5)).num_fewshot == 5  # type: ignore[attr-defined]
    assert get_task("gsm8k").num_fewshot == 5  # type: ignore[attr-defined]
    assert get_task("math500", TaskOptions(num_fewshot=0)).num_fewshot == 0  # type: ignore[attr-defined]
    for name, k in (
        ("arc_easy", 1),
        ("gpqa_diamond_zeroshot", 3),
        ("mmlu", 6),
        ("math500", 5),
        ("gsm8k", -1),
    ):
        with pytest.raises(EvalError):
            get_task(name, TaskOptions(num_fewshot=k))
