"""Multiple-choice tasks: requests (context, " " + choice, the cacheable prefix from the item's
few-shot block), acc / acc_norm, and refusal of a wrong number of log-likelihoods."""

from __future__ import annotations

import pytest

from evals.engines.base import LoglikelihoodRequest, LoglikelihoodResult
from evals.errors import EvalError
from evals.tasks import get_task
from evals.tasks.base import Item, TaskOptions
from evals.tasks.multiple_choice import mmlu_description
from tests.shared_data import SHARED_DATA as DATA_DIR


def ll(*values: float) -> LoglikelihoodResult:
    return LoglikelihoodResult(loglikelihoods=values, is_greedy=(False,) * len(values))


ARC_DOC = {
    "id": "7",
    "question": "q?",
    "choices": {"text": ["x", "yy", "zzz"], "label": ["A", "B", "C"]},
    "answerKey": "C",
}


def test_arc_task_scores_and_target() -> None:
    task = get_task("arc_easy")
    req = task.request(Item("7", ARC_DOC), repeat=0, seed=0)
    assert isinstance(req, LoglikelihoodRequest)
    assert req.context == "Question: q?\nAnswer:" and req.continuations == (" x", " yy", " zzz")
    assert req.prefix is None  # zero-shot, no description: nothing shared
    scored = task.score(Item("7", ARC_DOC), ll(-1.0, -4.0, -4.5))
    # acc: argmax 0 != 2; acc_norm divides by len("x")=1, 2, 3 -> -1, -2, -1.5 -> argmax 0
    assert scored.scores == {"acc,none": 0.0, "acc_norm,none": 0.0}
    assert scored.extracted == {"none": "0"} and scored.target == "2"
    assert task.score(Item("7", ARC_DOC), ll(-3.1, -4.0, -3.0)).scores == {"acc,none": 1.0, "acc_norm,none": 1.0}


def test_the_items_fewshot_block_is_the_shared_prefix() -> None:
    task = get_task("arc_easy")
    req = task.request(Item("7", ARC_DOC, fewshot="D\n\nQuestion: s\nAnswer: t\n\n"), repeat=0, seed=0)
    assert isinstance(req, LoglikelihoodRequest)
    assert req.context == "D\n\nQuestion: s\nAnswer: t\n\nQuestion: q?\nAnswer:"
    assert req.prefix == "D\n\nQuestion: s\nAnswer: t\n\n"


def test_mc_score_rejects_wrong_number_of_loglikelihoods() -> None:
    task = get_task("boolq")
    doc = {"id": "0", "passage": "p", "question": "q", "label": 1}
    with pytest.raises(EvalError):
        task.score(Item("0", doc), ll(-1.0))


@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data")
def test_mmlu_items_carry_description_and_subject_shots() -> None:
    items = get_task("mmlu", TaskOptions(num_fewshot=2)).items(DATA_DIR)
    first = items[0]
    assert first.doc["subject"] == "abstract_algebra" and "_fewshot" not in first.doc
    assert first.fewshot.startswith(mmlu_description(first.doc)) and first.fewshot.count("\nAnswer: ") == 2
    zero = get_task("mmlu").items(DATA_DIR)[0]
    assert zero.fewshot == mmlu_description(zero.doc)  # zero-shot still carries the description
