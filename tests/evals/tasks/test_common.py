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


# ----------------------------------------------------------------------------- unread options


@pytest.mark.parametrize(("name", "options", "match"), [
    ("arc_easy", TaskOptions(top_k=5), "top_k not read"),
    ("mmlu", TaskOptions(temperature=0.7, max_tokens=10), "max_tokens, temperature not read"),
    ("winogrande", TaskOptions(stop=("x",)), "stop not read"),
    ("lambada_openai", TaskOptions(think_tags=("<r>", "</r>")), "think_tags not read"),
    ("gsm8k", TaskOptions(system_prompt="Be brief."), "system_prompt only apply with chat = true"),
    ("arc_challenge", TaskOptions(fewshot_as_multiturn=True), "fewshot_as_multiturn only apply"),
    ("gsm8k_cot_llama", TaskOptions(chat_template_kwargs={"enable_thinking": False}), "chat_template_kwargs"),
    ("gsm8k", TaskOptions(extra={"shots": 3}), "unknown option"),
    ("wikitext_kl", TaskOptions(chat=True), "chat = true is not supported"),
    ("wikitext_kl", TaskOptions(temperature=0.5), "temperature not read"),
    ("needle", TaskOptions(chat=True), "chat = true is not supported"),
    ("gsm8k_cot_llama", TaskOptions(num_fewshot=9), "8 fixed examples"),
])
def test_unread_options_are_refused_in_one_line(name: str, options: TaskOptions, match: str) -> None:
    with pytest.raises(EvalError, match=match) as info:
        get_task(name, options, "smollm2-135m")
    assert "\n" not in str(info.value)


def test_generation_settings_reach_the_request() -> None:
    from evals.tasks import gsm8k

    defaults = get_task("gsm8k_cot_llama")
    assert defaults.settings == gsm8k.GenSettings(until=gsm8k.VARIANTS["gsm8k_cot_llama"].until, max_tokens=256)
    opts = TaskOptions(temperature=0.6, top_p=0.95, top_k=20, min_p=0.05, stop=("END",), max_tokens=64)
    task = get_task("gsm8k_cot_llama", opts)
    req = task.request(task.make_item({"id": "x", "question": "1+1?", "answer": "#### 2"}, ()), repeat=0, seed=7)
    assert (req.temperature, req.top_p, req.top_k, req.min_p, req.until, req.max_tokens, req.seed) == (
        0.6, 0.95, 20, 0.05, ("END",), 64, 7)
    greedy = defaults.request(defaults.make_item({"id": "x", "question": "q", "answer": "#### 2"}, ()), repeat=0, seed=7)
    assert (greedy.temperature, greedy.seed, greedy.top_k, greedy.min_p) == (0.0, None, 0, 0.0)
