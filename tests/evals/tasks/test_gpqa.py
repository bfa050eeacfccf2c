"""GPQA zero-shot and CoT on synthetic documents only (no real question text anywhere)."""

from __future__ import annotations

import pytest

from evals.engines.base import GenerateResult, LoglikelihoodResult
from evals.tasks import get_task, gpqa
from evals.tasks.base import Item


def gen(text: str) -> GenerateResult:
    return GenerateResult(text=text, output_tokens=len(text.split()), finish_reason="stop")


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


def test_shuffle_keeps_every_option_and_marks_the_gold() -> None:
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
def test_cot_filters(completion: str, strict: str, flexible: str) -> None:
    doc = _gpqa_doc()
    assert gpqa.extract(completion, doc) == {"strict-match": strict, "flexible-extract": flexible}


def test_cot_scores_against_gold_letter() -> None:
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


def test_zeroshot_scores_by_letter_target() -> None:
    doc = _gpqa_doc()
    task = get_task("gpqa_diamond_zeroshot")
    lls = [-5.0, -5.0, -5.0, -5.0]
    lls[gpqa.LETTERS.index(doc["answer"])] = -1.0
    scored = task.score(Item("rec0", doc), LoglikelihoodResult(loglikelihoods=tuple(lls), is_greedy=(False,) * 4))
    assert scored.scores == {"acc,none": 1.0, "acc_norm,none": 1.0} and scored.target == doc["answer"]
