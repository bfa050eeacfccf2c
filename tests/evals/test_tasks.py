"""Task scorers on hand-made results (answer filters, acc / acc_norm, MC2), the registry, and options."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import lm_eval
import pytest
from lm_eval.api.samplers import ContextSampler

from evals.engines.base import GenerateResult, LoglikelihoodResult
from evals.errors import EvalError
from evals.tasks import TASKS, get_task, gpqa, gsm8k, math500, truthfulqa, winogrande
from evals.tasks.base import Item, Task, TaskOptions
from evals.tasks.common import fewshot_block, mc_scores, sequential_fewshot_indices

OURS = [n for n in TASKS if n not in ("wikitext_kl", "needle")]


def gen(text: str) -> GenerateResult:
    return GenerateResult(text=text, output_tokens=len(text.split()), finish_reason="stop")


def ll(*values: float, greedy: tuple[bool, ...] | None = None) -> LoglikelihoodResult:
    return LoglikelihoodResult(loglikelihoods=values, is_greedy=greedy or (False,) * len(values))


# ----------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name", OURS)
def test_every_task_builds_and_is_versioned(name: str) -> None:
    task = get_task(name)
    assert isinstance(task, Task)
    assert task.name == name
    assert "+lm-eval-" in task.version


def test_every_task_names_its_datasets() -> None:
    from evals.data import DATASETS
    from evals.tasks import TASK_DATASETS

    assert set(TASK_DATASETS) == set(TASKS)
    assert all(d in DATASETS for ds in TASK_DATASETS.values() for d in ds)


def test_unknown_task_suggests_closest() -> None:
    with pytest.raises(EvalError, match="did you mean 'gsm8k'"):
        get_task("gsm8kk")


def test_reserved_probe_names_point_at_their_modules() -> None:
    assert TASKS["wikitext_kl"] == "evals.tasks.wikitext_kl" and TASKS["needle"] == "evals.tasks.needle"
    for name in ("wikitext_kl", "needle"):
        if importlib.util.find_spec(TASKS[name]) is None:
            with pytest.raises(EvalError, match="not available"):
                get_task(name)


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


def test_generation_options_reach_the_request() -> None:
    task = get_task("gsm8k", TaskOptions(num_fewshot=0, max_tokens=64, temperature=0.7))
    item = Item("0", {"question": "q", "answer": "a #### 1", "_fewshot": ""})
    req = task.request(item, repeat=1, seed=99)
    assert (req.max_tokens, req.temperature, req.seed, req.prompt) == (64, 0.7, 99, "Question: q\nAnswer:")
    greedy = get_task("gsm8k", TaskOptions(num_fewshot=0)).request(item, repeat=0, seed=99)
    assert greedy.seed is None and greedy.max_tokens == 256


# ----------------------------------------------------------------------------- GSM8K


def test_gsm8k_fewshot_draws_match_lm_eval_sampler() -> None:
    pool = list(range(7473))
    sampler = ContextSampler(pool, rnd=1234)
    expected = [list(sampler.sample(5)) for _ in range(3)]
    assert sequential_fewshot_indices(7473, 3, 5) == expected


GSM_TARGET = "Janet sells 16 - 3 - 4 = 9 duck eggs a day.\nShe makes 9 * 2 = $18 every day.\n#### 18"


@pytest.mark.parametrize(
    ("completion", "strict", "flexible", "strict_em", "flexible_em"),
    [
        (" She sells 9 eggs for $2 each.\n#### 18", "18", "18", 1.0, 1.0),
        (" 9 * 2 = 18 dollars. #### 18.", "18.", "18.", 1.0, 1.0),  # trailing "." is ignored
        (" She makes $1,8 ... no: the total is $18.", "[invalid]", "$18.", 0.0, 1.0),
        (" #### 17\nQuestion", "17", "17", 0.0, 0.0),
        (" I don't know.", "[invalid]", "[invalid]", 0.0, 0.0),
        (" #### -18", "-18", "-18", 0.0, 0.0),
    ],
)
def test_gsm8k_filters_and_exact_match(
    completion: str, strict: str, flexible: str, strict_em: float, flexible_em: float
) -> None:
    task = get_task("gsm8k", TaskOptions(num_fewshot=0))
    item = Item("0", {"question": "q", "answer": GSM_TARGET, "_fewshot": ""})
    scored = task.score(item, gen(completion))
    assert scored.extracted == {"strict-match": strict, "flexible-extract": flexible}
    assert scored.scores == {
        "exact_match,strict-match": strict_em,
        "exact_match,flexible-extract": flexible_em,
    }
    assert scored.target == GSM_TARGET


def test_gsm8k_exact_match_normalisation() -> None:
    assert gsm8k.exact_match("$1,234", "blah #### 1234") == 1.0
    assert gsm8k.exact_match("1234", "blah #### 1,234") == 1.0
    assert gsm8k.exact_match("12", "blah #### 1234") == 0.0


# ----------------------------------------------------------------------------- multiple choice


def test_acc_and_acc_norm_by_hand() -> None:
    # ll/len: -1/1 = -1.0 vs -2/4 = -0.5: raw argmax is 0, length-normalised argmax is 1
    assert mc_scores([-1.0, -2.0], 1, ["a", "bbbb"]) == {"acc,none": 0.0, "acc_norm,none": 1.0}
    assert mc_scores([-1.0, -2.0], 0, ["a", "bbbb"]) == {"acc,none": 1.0, "acc_norm,none": 0.0}
    with pytest.raises(EvalError):
        mc_scores([-1.0], 0, ["a", "b"])


def test_arc_task_scores_and_target() -> None:
    task = get_task("arc_easy")
    doc = {
        "id": "7",
        "question": "q?",
        "choices": {"text": ["x", "yy", "zzz"], "label": ["A", "B", "C"]},
        "answerKey": "C",
        "_fewshot": "",
    }
    req = task.request(Item("7", doc), repeat=0, seed=0)
    assert req.context == "Question: q?\nAnswer:" and req.continuations == (" x", " yy", " zzz")
    scored = task.score(Item("7", doc), ll(-1.0, -4.0, -4.5))
    # acc: argmax 0 != 2; acc_norm divides by len(" x")? no: by len("x")=1, 2, 3 -> -1, -2, -1.5 -> 0
    assert scored.scores == {"acc,none": 0.0, "acc_norm,none": 0.0}
    assert scored.extracted == {"none": "0"} and scored.target == "2"
    assert task.score(Item("7", doc), ll(-3.1, -4.0, -3.0)).scores == {"acc,none": 1.0, "acc_norm,none": 1.0}


def test_mc_score_rejects_wrong_number_of_loglikelihoods() -> None:
    task = get_task("boolq")
    doc = {"id": "0", "passage": "p", "question": "q", "label": 1, "_fewshot": ""}
    with pytest.raises(EvalError):
        task.score(Item("0", doc), ll(-1.0))


def _lm_eval_truthfulqa_utils():  # lm-eval's own utils module, loaded from its file
    path = Path(lm_eval.__file__).parent / "tasks/truthfulqa/utils.py"
    spec = importlib.util.spec_from_file_location("lm_eval_truthfulqa_utils", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_mc2_by_hand_and_against_lm_eval() -> None:
    doc = {"mc2_targets": {"choices": ["a", "b", "c"], "labels": [1, 1, 0]}}
    lls = [math.log(0.2), math.log(0.3), math.log(0.5)]
    assert truthfulqa.mc2_score(doc, lls, ["a", "b", "c"])["acc,none"] == pytest.approx(0.5, abs=1e-12)
    doc2 = {"mc2_targets": {"choices": ["a", "b", "c", "d"], "labels": [0, 1, 0, 1]}}  # labels not sorted
    lls2 = [-2.0, -1.0, -0.5, -3.0]
    theirs = _lm_eval_truthfulqa_utils().process_results_mc2(doc2, [(x, False) for x in lls2])["acc"]
    assert truthfulqa.mc2_score(doc2, lls2, ["a", "b", "c", "d"])["acc,none"] == pytest.approx(
        theirs, abs=1e-15
    )


def test_truthfulqa_mc1_gold_is_first_choice() -> None:
    task = get_task("truthfulqa_mc1")
    doc = {
        "id": "0",
        "question": "q?",
        "mc1_targets": {"choices": ["t", "f1", "f2"], "labels": [1, 0, 0]},
        "mc2_targets": {"choices": ["t"], "labels": [1]},
        "_fewshot": "",
    }
    assert task.score(Item("0", doc), ll(-1.0, -2.0, -3.0)).scores == {"acc,none": 1.0}
    assert task.score(Item("0", doc), ll(-2.0, -1.0, -3.0)).scores == {"acc,none": 0.0}
    req = task.request(Item("0", doc), repeat=0, seed=0)
    assert req.context == truthfulqa.QA_PRIMER + "\n\nQ: q?\nA:"
    assert req.prefix == truthfulqa.QA_PRIMER + "\n\nQ: "  # the primer is shared by every item


def test_winogrande_partial_scoring() -> None:
    doc = {"sentence": "Ann beat Bob so _ won the cup.", "option1": "Ann", "option2": "Bob", "answer": "1"}
    assert winogrande.partial_pairs(doc) == [
        ("Ann beat Bob so Ann", " won the cup."),
        ("Ann beat Bob so Bob", " won the cup."),
    ]
    task = get_task("winogrande")
    scored = task.score(Item("0", doc), ll(-2.0, -5.0))
    assert (
        scored.scores == {"acc,none": 1.0}
        and scored.extracted == {"none": "0"}
        and scored.target == "won the cup."
    )
    assert task.score(Item("0", {**doc, "answer": "2"}), ll(-2.0, -5.0)).scores == {"acc,none": 0.0}


def test_lambada_request_and_scores() -> None:
    task = get_task("lambada_openai")
    doc = {"id": "0", "text": "he opened the door and saw the \n\nrecorder"}
    req = task.request(Item("0", doc), repeat=0, seed=0)
    assert req.context == "he opened the door and saw the" and req.continuations == (" \n\nrecorder",)
    scored = task.score(Item("0", doc), ll(-1.5, greedy=(True,)))
    assert scored.scores == {"acc,none": 1.0, "loglikelihood,none": -1.5}


# ----------------------------------------------------------------------------- GPQA (synthetic docs only)


def _gpqa_doc() -> dict[str, str]:
    rows = [
        {
            "id": "rec0",
            "Record ID": "rec0",
            "Question": "synthetic?",
            "Correct Answer": "four",
            "Incorrect Answer 1": "one",
            "Incorrect Answer 2": " two  [title] x",
            "Incorrect Answer 3": "three",
        }
    ]
    return gpqa.shuffle_choices(rows)[0]


def test_gpqa_shuffle_keeps_every_option_and_marks_the_gold() -> None:
    doc = _gpqa_doc()
    assert sorted(doc["choices"]) == sorted(
        ["four", "one", "two . x", "three"]
    )  # strip, " [title]" -> ". ", "  " -> " "
    assert doc["choices"][gpqa.LETTERS.index(doc["answer"])] == "four"
    assert [doc[f"choice{i}"] for i in range(1, 5)] == doc["choices"]


@pytest.mark.parametrize(
    ("completion", "strict", "flexible"),
    [
        ("Reasoning... The answer is (B).", "(B)", "(B)"),
        ("Final answer: C", "[invalid]", "(C)"),
        ("(A) looks wrong, so (D) it is", "[invalid]", "(D)"),
        ("no idea", "[invalid]", "[invalid]"),
    ],
)
def test_gpqa_cot_filters(completion: str, strict: str, flexible: str) -> None:
    doc = _gpqa_doc()
    assert gpqa.extract(completion, doc) == {"strict-match": strict, "flexible-extract": flexible}


def test_gpqa_cot_scores_against_gold_letter() -> None:
    doc = _gpqa_doc()
    task = get_task("gpqa_diamond_cot_zeroshot")
    gold, wrong = doc["answer"], next(x for x in gpqa.LETTERS if x != doc["answer"])
    right = task.score(Item("rec0", doc), gen(f"so The answer is {gold}."))
    assert right.scores == {"exact_match,strict-match": 1.0, "exact_match,flexible-extract": 1.0}
    assert right.target == gold
    bad = task.score(Item("rec0", doc), gen(f"so The answer is {wrong}."))
    assert bad.scores == {"exact_match,strict-match": 0.0, "exact_match,flexible-extract": 0.0}
    # flexible-extract also finds the answer by its text: "four" is the gold choice
    assert task.score(Item("rec0", doc), gen("It must be four")).scores["exact_match,flexible-extract"] == 1.0


def test_gpqa_zeroshot_scores_by_letter_target() -> None:
    doc = {**_gpqa_doc(), "_fewshot": ""}
    task = get_task("gpqa_diamond_zeroshot")
    lls = [-5.0, -5.0, -5.0, -5.0]
    lls[gpqa.LETTERS.index(doc["answer"])] = -1.0
    scored = task.score(Item("rec0", doc), ll(*lls))
    assert scored.scores == {"acc,none": 1.0, "acc_norm,none": 1.0} and scored.target == doc["answer"]


# ----------------------------------------------------------------------------- MATH-500


def test_math500_prompt_and_prefix() -> None:
    task = get_task("math500")
    req = task.request(Item("x", {"problem": "What is $1+1$?", "solution": "$\\boxed{2}$"}), repeat=0, seed=0)
    assert (
        req.prefix == math500.fewshot_prefix(4)
        and req.prompt == req.prefix + "Problem:\nWhat is $1+1$?\n\nSolution:"
    )
    assert req.prefix.count("Problem:\n") == 4 and req.until == ("Problem:",)
    assert fewshot_block("", [("Q", "A")]) == "Q A\n\n"


def test_math500_scoring_uses_lm_eval_minerva() -> None:
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
